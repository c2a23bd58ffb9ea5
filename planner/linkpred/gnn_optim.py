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
    them all.

    The parameters are made views of one flat tensor (their values kept), and the moments are
    flat too: a step is then a few element-wise ops on one tensor instead of a few on each
    parameter, with the same operation on each element. A state dict loaded into the network
    is copied into those views, so the next step starts from it."""

    def __init__(self, params: Iterable[Tensor], lr: float, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.steps = 0
        self.flat = torch.cat([param.detach().reshape(-1) for param in self.params])
        offset = 0
        for param in self.params:
            param.data = self.flat[offset:offset + param.numel()].view_as(param)
            offset += param.numel()
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One step of every parameter (each must have a gradient): the ops of
        torch.optim.Adam's single-tensor path, on the flat tensors."""
        beta1, beta2 = self.betas
        if any(param.grad is None for param in self.params):
            raise ValueError("Adam.step: every parameter needs a gradient")
        grad = torch.cat([param.grad.reshape(-1) for param in self.params])
        self.steps += 1
        if self.weight_decay != 0:
            grad = grad.add(self.flat, alpha=self.weight_decay)
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = float(self.steps)
        step_size = self.lr / (1 - beta1 ** step)
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        denom = self.exp_avg_sq.sqrt().div_(bias_correction2_sqrt).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-step_size)
