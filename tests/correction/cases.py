"""Hand-made log-prob batches for the correction and metric tests.

Three real sequences of different lengths plus one empty row, right-padded to width 4. The ratios
ρ_t = π_trainer / π_rollout are chosen by hand; padding holds garbage (NaN, large values) that every
correction and metric must ignore.
"""

import math

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K

NAN = float("nan")
RHO = [
    [2.0, 0.5, 3.0],        # length 3
    [0.25],                 # length 1
    [1.0, 1.0, 1.5, 1.1],   # length 4
    [],                     # empty row
]
WIDTH = 4


def batch(rho=RHO) -> TensorDict:
    rows = len(rho)
    rollout = torch.full((rows, WIDTH), NAN)
    trainer = torch.full((rows, WIDTH), 7.0)
    mask = torch.zeros(rows, WIDTH, dtype=torch.bool)
    for i, r in enumerate(rho):
        for t, value in enumerate(r):
            lp = -1.0 - 0.25 * t - 0.5 * i
            rollout[i, t] = lp
            trainer[i, t] = lp + math.log(value)
            mask[i, t] = True
    return TensorDict(
        {K.LOGP_ROLLOUT: rollout, K.LOGP_TRAINER: trainer, K.MASK_RESPONSE: mask}, batch_size=[rows]
    )


def per_token(values_per_row, fill=0.0):
    """[[...], ...] per real token -> a [rows, WIDTH] tensor padded with `fill`."""
    out = torch.full((len(values_per_row), WIDTH), fill, dtype=torch.float32)
    for i, r in enumerate(values_per_row):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out


def per_row(values, lengths=(3, 1, 4, 0)):
    """One value per row, repeated over its real tokens (padding 0 / False)."""
    return [[v] * n for v, n in zip(values, lengths)]
