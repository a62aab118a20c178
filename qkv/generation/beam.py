"""Decoding an encoder-decoder: greedy search and batched beam search, with the KV cache.

"We used beam search with a beam size of 4 and length penalty alpha = 0.6 ... We set the maximum
output length during inference to input length + 50, but terminate early when possible" (Section 6.1).

Both searches encode the sources once; with the cache, each step feeds the decoder only the newest
token, decoder self-attention appends one position to its cache, and cross-attention keys and values
are computed from the encoder output once per source. Beam search reorders the caches with the
surviving hypotheses after every step (``model.reorder_cache``), or a hypothesis would continue from
another's past. A sentence leaves the batch as soon as it is done, so the rest decode a smaller batch.
Of a step's results the search reads back to the host only how many sentences are done (and the
cache reorder which rows moved): its bookkeeping (the top-k, the row each hypothesis goes to, the
n_best best finished scores that decide when to stop) is tensor operations on the model's device,
and the finished hypotheses become Python objects once, after the search.

The length penalty is GNMT's (Wu et al., 2016), which the paper's alpha refers to:
``lp(Y) = ((5 + |Y|) / 6) ** alpha`` and a finished hypothesis scores ``log P(Y | X) / lp(Y)``, with
``|Y|`` counting the ``<eos>``. A hypothesis is finished when it emits ``<eos>`` among the ``beam_size``
best candidates of a step. A sentence is done when it has ``n_best`` finished hypotheses and the best
one still growing could not beat them if it ended now (its log-probability over the same length
penalty; Hugging Face's rule), or when it reaches its maximum length, where ``<eos>`` is the only
token allowed. Stopping as soon as ``beam_size`` hypotheses have finished (fairseq's rule) is faster
but wrong for confident models: unlikely hypotheses end early, fill the quota, and the sentence stops
while the best hypothesis is still growing.
"""

from __future__ import annotations

import math

from typing import NamedTuple

import torch
from torch import Tensor

from qkv.config import ALPHA, BEAM, EXTRA
from qkv.errors import ConfigError
from qkv.accel.kernels import decoding_model
from qkv.modules.attention import padding_mask


class Hypothesis(NamedTuple):
    """One output of beam search.

    Attributes:
        tokens: the generated ids, without ``<bos>`` and ``<eos>``.
        score: ``logprob / lp(len(tokens) + 1)``, what hypotheses are ranked by.
        logprob: the sum of the log-probabilities of the tokens and of the final ``<eos>``.
    """

    tokens: list[int]
    score: float
    logprob: float


def check_alpha(alpha: float) -> None:
    """The length penalty's alpha must be a finite number >= 0 (0: no normalization; the paper: 0.6)."""
    if not (alpha >= 0 and math.isfinite(alpha)):
        raise ConfigError(f"alpha (the length penalty) must be a finite number >= 0, got {alpha}")


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha; 1 for alpha = 0 (no normalization)."""
    return ((5.0 + length) / 6.0) ** alpha


def max_new_tokens(src: Tensor, pad_id: int, model_max_len: int, extra: int = EXTRA,
                   limit: int | None = None) -> Tensor:
    """Per sentence, the most tokens to generate before ``<eos>``: source length + ``extra``.

    Args:
        src: (B, S) right-padded source ids.
        pad_id: padding id.
        model_max_len: the decoder's positions; ``<bos>`` takes one, so at most ``model_max_len - 1``.
        extra: the paper's 50.
        limit: if given, use this for every sentence instead of source length + extra (still capped).

    Returns:
        (B,) long tensor.
    """
    if limit is not None:
        lengths = torch.full((src.shape[0],), int(limit), dtype=torch.long, device=src.device)
    else:
        lengths = (src != pad_id).sum(dim=1) + extra
    return lengths.clamp(min=0, max=model_max_len - 1)


def _only_eos(logits: Tensor, rows: Tensor, eos_id: int) -> Tensor:
    """Make ``<eos>`` the only possible token on the rows where ``rows`` is True."""
    forbid = torch.ones_like(logits[0], dtype=torch.bool)
    forbid[eos_id] = False
    return logits.masked_fill(rows[:, None] & forbid[None, :], float("-inf"))


def _survivors(done: Tensor) -> Tensor:
    """The rows that go on, ordered so that most keep their place: the last ones fill the places of those done.

    The order of the sentences in a batch does not matter (``sentences`` says which is which), but
    their KV caches move with it: keeping the survivors in order shifts every row after the first to
    finish, where filling the gaps from the end moves only as many sentences as have finished.

    Args:
        done: (N,) bool.

    Returns:
        (N',) the indices of the rows not done; ``keep[i] == i`` wherever row i goes on and i < N'.
    """
    alive = (~done).nonzero().squeeze(1)  # (N',)
    n = alive.shape[0]
    keep = torch.arange(n, device=done.device)
    keep[done[:n].nonzero().squeeze(1)] = alive[alive >= n]  # the gaps, from the end
    return keep


def _best_continuations(logp: Tensor, scores: Tensor, m: int, chunk: int = 64) -> tuple[Tensor, Tensor, Tensor]:
    """The ``m`` best continuations of each sentence, ``scores[i, j] + logp[i, j, v]`` over beams j and tokens v.

    A top-k over all K * V candidates of a sentence took as long as the log-softmax and most of a
    step's bookkeeping. Instead the vocabulary is cut into chunks: a chunk that holds one of the m
    best holds a value at least the m-th best, so the m chunks with the best maxima hold all of the m
    best (ties may be broken otherwise), and the top-k runs over their m * ``chunk`` values only.

    Args:
        logp: (N, K, V) log-probabilities of the next token of each hypothesis.
        scores: (N, K) the hypotheses' log-probabilities so far.
        m: how many (at most K * V).

    Returns:
        (N, m) each: the candidates' scores, best first, their beams (0..K-1) and their tokens.
    """
    n, k, v = logp.shape
    full = v // chunk * chunk
    maxima = logp[..., :full].reshape(n, k, full // chunk, chunk).amax(dim=-1)  # (N, K, V // C)
    if full < v:  # the last, shorter chunk
        maxima = torch.cat([maxima, logp[..., full:].amax(dim=-1, keepdim=True)], dim=-1)
    per_beam = maxima.shape[-1]  # chunks per beam
    best = (maxima + scores[:, :, None]).view(n, k * per_beam).topk(min(m, k * per_beam), dim=-1).indices  # (N, M')
    beam = torch.div(best, per_beam, rounding_mode="floor")  # (N, M')
    token = (best % per_beam)[:, :, None] * chunk + torch.arange(chunk, device=logp.device)  # (N, M', C)
    flat = beam[:, :, None] * v + token.clamp(max=v - 1)  # (N, M', C) indices into (N, K * V)
    values = logp.reshape(n, k * v).gather(1, flat.view(n, -1)).view(flat.shape)  # (N, M', C)
    values = (values + scores.gather(1, beam)[:, :, None]).masked_fill(token >= v, float("-inf"))  # past the end
    top, at = values.view(n, -1).topk(m, dim=-1)  # (N, m)
    ids = flat.view(n, -1).gather(1, at)  # (N, m)
    return top, torch.div(ids, v, rounding_mode="floor"), ids % v


def _stay_in_place(parents: Tensor) -> Tensor:
    """Where each of a step's continuations goes among its sentence's k rows: its parent's, if it can.

    The order of a sentence's hypotheses in its rows does not matter, but the KV cache of a row has to
    hold the past of the hypothesis in it. The first continuation of each parent takes the parent's
    row, whose past it shares, and the other continuations fill the rows whose parents have no
    continuation, in order. Only those rows need another row's past copied into their cache, k minus
    the number of parents, instead of every row whose parent sits elsewhere. Tensor operations on
    the device, without reading anything back to the host.

    Args:
        parents: (N, K) the row (0..K-1) each continuation extends, best continuation first.

    Returns:
        (N, K) ``order``: row j of sentence i gets continuation ``order[i, j]``.
    """
    n, k = parents.shape
    j = torch.arange(k, device=parents.device)  # (K,) continuations, and rows
    same = parents[:, :, None] == parents[:, None, :]  # (N, K, K): continuations j and j' share a parent
    first = ~(same & (j[:, None] > j[None, :])).any(-1)  # (N, K): no better continuation has j's parent
    claimed = ((parents[:, :, None] == j) & first[:, :, None]).any(1)  # (N, K): rows a first continuation takes
    free = torch.sort(claimed.to(torch.uint8), dim=1, stable=True).indices  # (N, K): unclaimed rows first, in order
    rank = ((~first).cumsum(1) - 1).clamp(min=0)  # (N, K): the place of each other continuation among the others
    row = torch.where(first, parents, free.gather(1, rank))  # (N, K): the row each continuation goes to
    return torch.empty_like(parents).scatter_(1, row, j.expand(n, k))


@torch.no_grad()
def greedy_search(model, src: Tensor, bos_id: int, eos_id: int, extra: int = EXTRA,
                  limit: int | None = None, use_cache: bool = True) -> list[list[int]]:
    """The most likely next token at every step, for a batch of sources.

    Args:
        model: a :class:`~qkv.models.transformer.Transformer`.
        src: (B, S) source ids, right-padded with ``model.cfg.pad_id``.
        bos_id, eos_id: the target start and end ids.
        extra: maximum output length = source length + ``extra`` (see :func:`max_new_tokens`).
        limit: a fixed maximum output length instead.
        use_cache: False recomputes the whole prefix every step (slow; for testing the cache).

    Returns:
        For each source, the generated ids without ``<bos>`` and ``<eos>``.
    """
    b = src.shape[0]
    limits = max_new_tokens(src, model.cfg.pad_id, model.cfg.max_len, extra, limit)  # (B,)
    steps = int(limits.max()) if b else 0
    # The decoding model: a copy in eval mode that shares the model's weights, with caches for b rows and the
    # step's weights laid out for them (qkv.accel.kernels.decoding_model); the model itself is not changed.
    decoder = decoding_model(model, b if use_cache else None, steps + 1)
    src_mask = padding_mask(src, model.cfg.pad_id)  # (B, 1, 1, S)
    memory = decoder.encode(src, src_mask)  # (B, S, D)
    alive = torch.arange(b, device=src.device)  # the original rows still decoding
    tokens = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)  # (N, t + 1)
    log: list[tuple[Tensor, Tensor]] = []  # per step, the rows decoding and their tokens: read back once, after
    first_limit = int(limits.min()) if b else 0  # before this step no row is at its limit
    for t in range(steps + 1):  # t tokens generated so far
        if use_cache:
            logits = decoder.decode(tokens[:, -1:], memory if t == 0 else None, src_mask)[:, -1]  # (N, V)
        else:
            logits = decoder.decode(tokens, memory, src_mask)[:, -1]  # (N, V)
        if t >= first_limit:
            logits = _only_eos(logits, limits[alive] <= t, eos_id)
        nxt = logits.argmax(dim=-1)  # (N,)
        log.append((alive, nxt))
        ended = nxt == eos_id
        n_ended = int(ended.sum())  # the step's one read from the device
        if n_ended == ended.shape[0]:
            break
        if n_ended:
            keep = _survivors(ended)  # (N',)
            alive, tokens, nxt, src_mask = alive[keep], tokens[keep], nxt[keep], src_mask[keep]
            memory = memory[keep]
            if use_cache:
                decoder.reorder_cache(keep, sources=keep)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
    return _greedy_outputs(log, b, eos_id)


def _greedy_outputs(log: list[tuple[Tensor, Tensor]], b: int, eos_id: int) -> list[list[int]]:
    """Each source's tokens, from the (rows, tokens) of every step: (N,) original indices and (N,) ids."""
    out: list[list[int]] = [[] for _ in range(b)]
    for rows, nxt in log:
        for row, tok in zip(rows.tolist(), nxt.tolist()):
            if tok != eos_id:
                out[row].append(tok)
    return out


@torch.no_grad()
def beam_search(model, src: Tensor, bos_id: int, eos_id: int, beam_size: int = BEAM, alpha: float = ALPHA,
                n_best: int = 1, extra: int = EXTRA, limit: int | None = None,
                use_cache: bool = True) -> list[list[Hypothesis]]:
    """Beam search over a batch of sources (Section 6.1: beam 4, alpha 0.6, max length source + 50).

    Args:
        model: a :class:`~qkv.models.transformer.Transformer`.
        src: (B, S) source ids, right-padded with ``model.cfg.pad_id``.
        bos_id, eos_id: the target start and end ids.
        beam_size: hypotheses kept per sentence (1 = greedy search).
        alpha: length penalty exponent (0: rank by plain log-probability).
        n_best: hypotheses returned per sentence, best first (at most ``beam_size``).
        extra: maximum output length = source length + ``extra``.
        limit: a fixed maximum output length instead.
        use_cache: False recomputes the whole prefix every step (slow; for testing the cache).

    Returns:
        For each source, up to ``n_best`` :class:`Hypothesis`, best first.
    """
    if beam_size < 1:
        raise ConfigError(f"beam_size must be >= 1, got {beam_size}")
    check_alpha(alpha)
    if not 1 <= n_best <= beam_size:
        raise ConfigError(f"n_best must be between 1 and beam_size={beam_size}, got {n_best}")
    b, k, device = src.shape[0], beam_size, src.device
    limits = max_new_tokens(src, model.cfg.pad_id, model.cfg.max_len, extra, limit)  # (B,)
    steps = int(limits.max()) if b else 0
    # The decoding model, as greedy search's, with caches for the b * k rows of the beams.
    decoder = decoding_model(model, b * k if use_cache else None, steps + 1)
    src_mask = padding_mask(src, model.cfg.pad_id)  # (B, 1, 1, S)
    memory = decoder.encode(src, src_mask)  # (B, S, D)
    # Every sentence has k rows, one per hypothesis: row i * k + j is hypothesis j of sentence i. The
    # k rows share one copy of the source (memory and src_mask stay (B, ...)): cross-attention lets
    # consecutive groups of k rows attend to one row of memory, so its keys and values are computed
    # and read once per sentence.
    tokens = torch.full((b * k, 1), bos_id, dtype=torch.long, device=device)  # (N * K, t + 1)
    # Cumulative log-probabilities; all hypotheses start as the same empty one, so only the first
    # may expand at step 0 (or the beam would fill with k copies of the same token).
    scores = torch.full((b, k), float("-inf"), device=device)  # (N, K)
    scores[:, 0] = 0.0
    sentences = torch.arange(b, device=device)  # original index of each sentence still decoding
    # The step reads nothing back to the host but how many sentences are done. Finished hypotheses
    # stay on the device: each step's <eos> candidates are logged (their tokens are in that step's
    # ``tokens``) and turned into Hypothesis objects once, after the search; what the stopping rule
    # needs, the n_best best finished scores of each sentence, is kept as a tensor.
    best_finished = torch.full((b, n_best), float("-inf"), dtype=torch.float64, device=device)  # (N, n_best)
    log: list[tuple[int, Tensor, Tensor, Tensor, Tensor, Tensor]] = []
    first_limit = int(limits.min()) if b else 0  # before this step no sentence is at its limit
    if use_cache:  # the first step decodes one row per sentence (see below)
        decoder.reorder_cache(torch.arange(b, device=device))
    for t in range(steps + 1):  # t tokens generated so far
        n = sentences.shape[0]
        # At first all k hypotheses of a sentence are the same empty one: decode it once and score
        # its continuations for every row; the cache reorder after the step copies its past to
        # the sentence's k rows.
        step = tokens[::k] if t == 0 else tokens  # (N, t + 1) at first, then (N * K, t + 1)
        if use_cache:
            logits = decoder.decode(step[:, -1:], memory if t == 0 else None, src_mask)[:, -1]  # (N or N * K, V)
        else:
            logits = decoder.decode(step, memory, src_mask)[:, -1]  # (N or N * K, V)
        if t == 0:
            logits = logits.repeat_interleave(k, dim=0)  # (N * K, V)
        at_limit = limits[sentences] <= t  # (N,)
        logits = logits.float()
        logp = torch.log_softmax(logits, dim=-1, out=logits)  # in place: the logits are ours, 2 MB less to touch
        if t >= first_limit:
            logp = _only_eos(logp, at_limit.repeat_interleave(k), eos_id)
        vocab = logp.shape[-1]
        # 2k candidates: even if k of them end with <eos>, k others can continue.
        top_scores, from_beam, top_tokens = _best_continuations(
            logp.view(n, k, vocab), scores, min(2 * k, k * vocab))  # (N, 2K) each
        is_eos = top_tokens == eos_id
        # <eos> among the k best candidates finishes a hypothesis.
        ends = is_eos[:, :k] & torch.isfinite(top_scores[:, :k])  # (N, K)
        log.append((t, ends, top_scores[:, :k], from_beam[:, :k], sentences, tokens))
        lp = length_penalty(t + 1, alpha)
        # The finished scores in float64 (as Hypothesis.score is computed), the n_best best kept.
        ended = (top_scores[:, :k].double() / lp).masked_fill(~ends, float("-inf"))  # (N, K)
        best_finished = torch.cat([best_finished, ended], dim=1).topk(n_best, dim=1).values  # (N, n_best)
        # The k best candidates that do not end continue.
        alive_scores, pick = top_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=-1)  # (N, K)
        # Done: n_best have finished and none of them would lose to the best growing hypothesis,
        # were it to end now (with beam 1 this is exactly when greedy search stops).
        kth_finished = best_finished[:, -1].float()  # (N,)
        done = at_limit | (torch.isfinite(kth_finished) & (kth_finished >= alive_scores[:, 0] / lp))
        n_done = int(done.sum())  # the step's one read from the device
        if n_done == n:
            break
        beams = from_beam.gather(1, pick)  # (N, K)
        order = _stay_in_place(beams)  # (N, K): most hypotheses stay in their parent's row
        pick = pick.gather(1, order)
        beams, alive_scores = beams.gather(1, order), alive_scores.gather(1, order)  # (N, K)
        next_tokens = top_tokens.gather(1, pick)  # (N, K)
        if n_done:  # sentences leave: their rows, scores and sources go
            keep = _survivors(done)  # (N',)
            beams, next_tokens, alive_scores = beams[keep], next_tokens[keep], alive_scores[keep]
            sentences, best_finished = sentences[keep], best_finished[keep]
            src_mask = src_mask[keep]
            memory = memory[keep] if not use_cache else None
        parents = keep if n_done else torch.arange(n, device=device)  # (N',) the sentences that go on
        rows = (parents[:, None] * k + beams).reshape(-1)  # (N' * K,) the rows the survivors extend
        tokens = torch.cat([tokens[rows], next_tokens.reshape(-1, 1)], dim=1)  # (N' * K, t + 2)
        scores = alive_scores
        if use_cache:  # (the first step's cache has one row per sentence: row i of sentence i)
            decoder.reorder_cache(rows // k if t == 0 else rows, sources=keep if n_done else None)
    finished = _finished_hypotheses(log, b, k, alpha)
    lost = [i for i, hyps in enumerate(finished) if not hyps]
    if lost:  # every candidate scored NaN: nothing to rank
        raise FloatingPointError(f"beam search: the model's scores are not finite (NaN) for sentence(s) {lost[:5]}; "
                                 "no hypothesis can be ranked. Check the weights (qkv eval) or the input")
    return [sorted(hyps, key=lambda h: -h.score)[:n_best] for hyps in finished]


def _finished_hypotheses(log: list[tuple[int, Tensor, Tensor, Tensor, Tensor, Tensor]], b: int, k: int,
                         alpha: float) -> list[list[Hypothesis]]:
    """The hypotheses that ended with ``<eos>``, per sentence, in the order they ended.

    Args:
        log: per step ``(t, ends, scores, beams, sentences, tokens)``: (N, K) which of the k best
            candidates are ``<eos>``, their log-probabilities and the rows (0..K-1) they extend, the
            (N,) original index of each sentence, and the (N * K, t + 1) tokens of the step's rows.
        b: the sentences searched.
    """
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    for t, ends, scores, beams, sentences, tokens in log:
        i, j = ends.nonzero().unbind(1)  # (E,) each: the sentence and the place of each ended hypothesis
        if not i.numel():
            continue
        lp = length_penalty(t + 1, alpha)
        # Read back once per step, not once per hypothesis (a search ends hundreds of them).
        rows = tokens[i * k + beams[i, j], 1:].tolist()  # (E, t) the ended hypotheses' tokens
        for sentence, row, logprob in zip(sentences[i].tolist(), rows, scores[i, j].tolist()):
            finished[sentence].append(Hypothesis(row, logprob / lp, logprob))
    return finished


__all__ = ["Hypothesis", "length_penalty", "max_new_tokens", "greedy_search", "beam_search"]
