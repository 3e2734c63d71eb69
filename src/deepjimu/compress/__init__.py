"""Cutting ddp's gradient traffic: compressors as DDP comm hooks, local SGD, a link probe and a cost model.

``spec`` parses ``--compress`` (no torch import: the config checks use it); ``hooks`` builds
the comm hook of an option (torch's own for fp16, bf16, powersgd and local SGD; ``topk`` and
``qsgd`` are written here); ``probe`` measures the link and the device; ``cost`` predicts the
step time of every option from a probe and picks one for ``--compress auto``.
"""
