"""Replaying sampling masks on a trainer's logits.

The server sampled token t from its support S_t with probabilities
softmax(z_t / T) restricted to S_t (after logit bias and penalties, which
the trainer applies to its logits if it used them).  Replaying is
log_softmax over S_t of the trainer's logits: the logprob of the sampled
token under the trainer's policy, restricted exactly as the behaviour
policy was.  With the same weights these equal the behaviour logprobs
the server returned (to float32 rounding); the difference is the
importance ratio.

logits: [n_tokens, vocab], row t the logits token t was sampled from.
"""

import warnings

from .masks import MaskInvariantError, np


def _rows_np(mask):
    lengths = np.diff(np.asarray(mask.offsets, dtype=np.int64))
    if len(lengths) and lengths.min() < 1:
        raise MaskInvariantError("a mask row is empty")
    return np.repeat(np.arange(len(lengths)), lengths)


def replay_numpy(logits, mask, token_ids, temperature=1.0):
    """(token_logprobs [n], support_logprobs [n_ids]), float32 numpy.

    token_logprobs[t]: the sampled token's logprob normalized over row t;
    support_logprobs: every id's, aligned with mask.ids.  Computed in
    float64 relative to each row's maximum.
    """
    if np is None:
        raise RuntimeError("replay_numpy needs numpy")
    logits = np.asarray(logits)
    n = mask.n_tokens
    if logits.ndim != 2 or logits.shape[0] != n:
        raise ValueError("logits must be [%d, vocab], not %s"
                         % (n, logits.shape))
    if temperature <= 0:
        # greedy rows hold the argmax alone: its logprob is 0
        temperature = 1.0
    ids = np.asarray(mask.ids, dtype=np.int64)
    off = np.asarray(mask.offsets, dtype=np.int64)
    rows = _rows_np(mask)
    z = logits[rows, ids].astype(np.float64) / float(temperature)
    if n == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.float32)
    m = np.maximum.reduceat(z, off[:-1])
    d = z - m[rows]
    lse = np.log(np.add.reduceat(np.exp(d), off[:-1]))
    support = d - lse[rows]
    pos = np.asarray(mask.positions(token_ids), dtype=np.int64)
    return support[pos].astype(np.float32), support.astype(np.float32)


def replay_torch(logits, mask, token_ids, temperature=1.0):
    """(token_logprobs [n], support_logprobs [n_ids]) as torch tensors,
    differentiable with respect to logits (on logits' device and dtype)."""
    import torch

    n = mask.n_tokens
    if logits.dim() != 2 or logits.shape[0] != n:
        raise ValueError("logits must be [%d, vocab], not %s"
                         % (n, tuple(logits.shape)))
    if temperature <= 0:
        temperature = 1.0
    dev = logits.device
    ids = torch.as_tensor(_plain(mask.ids), dtype=torch.long, device=dev)
    off = torch.as_tensor(_plain(mask.offsets), dtype=torch.long,
                          device=dev)
    lengths = off[1:] - off[:-1]
    if n and int(lengths.min()) < 1:
        raise MaskInvariantError("a mask row is empty")
    rows = torch.repeat_interleave(torch.arange(n, device=dev), lengths)
    z = logits[rows, ids] / temperature
    # the row maxima only shift: no gradient through them
    m = torch.full((n,), float("-inf"), dtype=z.dtype, device=dev)
    with warnings.catch_warnings():
        # torch < 2.0 calls scatter_reduce beta; its amax is what is used
        warnings.simplefilter("ignore", UserWarning)
        m = m.scatter_reduce(0, rows, z.detach(), reduce="amax",
                             include_self=True)
    d = z - m[rows]
    s = torch.zeros(n, dtype=z.dtype, device=dev).index_add(0, rows,
                                                           d.exp())
    support = d - s.log()[rows]
    pos = torch.as_tensor(mask.positions(token_ids), dtype=torch.long,
                          device=dev)
    return support[pos], support


def _plain(a):
    if np is not None:
        return np.asarray(a)
    return list(a)
