"""``python -m deepjimu`` runs the ``jimu`` command line."""

from deepjimu.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
