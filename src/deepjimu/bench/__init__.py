"""``jimu bench``: strategies x models x options x worker counts on the same data and seed.

Every configuration runs as its own ``python -m deepjimu train ... --quiet`` process, one
after the other, under ``<bench-dir>/<name>/runs/<configuration>``; the bench then writes
``results.csv``, ``report.md`` and PNG plots into ``<bench-dir>/<name>``. Any ``jimu train``
option is also a bench option; given a comma list (``--lr 1e-3,3e-3``, ``--precision
fp32,bf16``) it becomes one more matrix dimension. ``--tune`` first gives every strategy the
same number of trials of its tuned options on the validation split.

``flags`` (light: what the CLI's ``--help`` needs), ``matrix`` (the cells), ``options`` and
``record`` (the bench and its ``bench.json``), ``run`` (``bench_from_args``, ``run_bench``),
``runner`` (one run), ``tune``, ``results``, ``plots``, ``markdown``.

Example:
    jimu bench --strategies local,ddp --workers 1,2 --models mlp:64x2 --epochs 5
    jimu bench --dataset mnist --data-dir ../shared/data --downsample 2 --tune
"""
