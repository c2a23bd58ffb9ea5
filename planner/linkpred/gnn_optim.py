"""Adam for the link predictor's fit, in plain tensor ops.

It takes the steps of ``torch.optim.Adam`` (its single-tensor CPU path, L2 weight decay, no
amsgrad) with the same operations on each element, so a fit gives the same weights; it
exists because every ``torch.optim`` optimiser imports ``torch._dynamo`` when it is built,
about two seconds of each ``hulk-planner fleet complete``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor


class Adam:
    """Adam (Kingma and Ba) with L2 weight decay added to the gradient, over parameters that
    all get a gradient at every step (as the link predictor's do), so one step count serves
    them all."""

    def __init__(self, params: Iterable[Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format)
                        for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format)
                           for p in self.params]

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One step of every parameter (each must have a gradient). The ``_foreach`` ops do
        per tensor what torch.optim.Adam's loop does, in one call."""
        beta1, beta2 = self.betas
        if any(param.grad is None for param in self.params):
            raise ValueError("Adam.step: every parameter needs a gradient")
        grads = [param.grad for param in self.params]
        self.steps += 1
        if self.weight_decay != 0:
            grads = torch._foreach_add(grads, self.params, alpha=self.weight_decay)
        torch._foreach_lerp_(self.exp_avg, grads, 1 - beta1)
        torch._foreach_mul_(self.exp_avg_sq, beta2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, value=1 - beta2)
        step = float(self.steps)
        step_size = self.lr / (1 - beta1 ** step)
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, bias_correction2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(self.params, self.exp_avg, denom, value=-step_size)
