"""``python -m deepjimu`` runs the ``jimu`` command line."""

from deepjimu.cli import entry

if __name__ == "__main__":
    entry()
