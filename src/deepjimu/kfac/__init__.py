"""K-FAC: second-order preconditioning of SGD, distributed as in KAISA (Pauloski et al., SC21).

factors (A and G of a batch), precondition (eigen / inverse forms, KL clipping),
assignment (who decomposes and who preconditions each layer, and what it broadcasts: no
torch, the planner prices it), layers (hooks), preconditioner (the distributed steps
through Comm), optimizer (SGD on the result: ``KFAC``).
"""
