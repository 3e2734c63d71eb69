"""Graph convolutional network (Kipf & Welling, ICLR 2017): two graph convolutions over the whole graph."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["GCN", "GraphConv", "gcn"]

DROPOUT = 0.5  # Kipf & Welling's rate, on the input of each layer


class GraphConv(nn.Module):
    """One graph convolution: ``A_hat (dropout(H) W) + b``, then ReLU unless it is the last layer.

    Args:
        n_in, n_out: feature widths of H and of the output.
        relu: apply ReLU to the output.
    """

    def __init__(self, n_in: int, n_out: int, relu: bool) -> None:
        super().__init__()
        self.dropout = nn.Dropout(DROPOUT)
        self.linear = nn.Linear(n_in, n_out)
        self.relu = relu
        # Glorot weights and zero bias, as in the paper's code
        nn.init.xavier_uniform_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, h: Tensor, adj: Tensor) -> Tensor:
        hw = F.linear(self.dropout(h), self.linear.weight)
        # the sparse product in adj's dtype, outside autocast: there are no bfloat16
        # sparse CSR kernels (bf16 runs cast it down and fail)
        with torch.autocast(adj.device.type, enabled=False):
            out = torch.sparse.mm(adj, hw.to(adj.dtype)) + self.linear.bias
        return torch.relu(out) if self.relu else out


class GCN(nn.Sequential):
    """A sequence of :class:`GraphConv` blocks whose forward also takes the adjacency.

    ``model(x, adj)`` maps the features of all N nodes ``[N, F]`` and the normalised
    adjacency ``A_hat`` (a sparse ``[N, N]`` tensor) to logits for every node ``[N, C]``;
    a loss or accuracy then picks the rows of the nodes it is about.
    """

    def forward(self, x: Tensor, adj: Tensor) -> Tensor:  # type: ignore[override]
        for layer in self:
            x = layer(x, adj)
        return x


def gcn(n_features: int, hidden: int, num_classes: int) -> GCN:
    """Kipf & Welling's two-layer GCN: ``A_hat relu(A_hat X W0) W1``, dropout 0.5 before each layer.

    Example:
        >>> gcn(1433, 16, 7)
        GCN(
          (0): GraphConv(
            (dropout): Dropout(p=0.5, inplace=False)
            (linear): Linear(in_features=1433, out_features=16, bias=True)
          )
          (1): GraphConv(
            (dropout): Dropout(p=0.5, inplace=False)
            (linear): Linear(in_features=16, out_features=7, bias=True)
          )
        )
    """
    return GCN(GraphConv(n_features, hidden, relu=True), GraphConv(hidden, num_classes, relu=False))
