"""Greedy and beam search: beam 1 = greedy, cached = uncached, batch = one by one, scores = rescoring."""

import pytest
import torch
import torch.nn.functional as F

from qkv.config import preset
from qkv.generation.beam import (_best_continuations, _stay_in_place, _survivors, beam_search, greedy_search,
                                length_penalty, max_new_tokens)
from qkv.models.transformer import Transformer
from qkv.modules.attention import padding_mask

BOS, EOS, PAD = 1, 2, 0
V = 24


@pytest.fixture(scope="module")
def model():
    """A random tiny Transformer whose <eos> logit is strong enough that outputs end at varied lengths."""
    torch.manual_seed(0)
    cfg = preset("tiny-transformer", vocab_size=V, dropout=0.0, tie_embeddings=False, max_len=40)
    m = Transformer(cfg).eval()
    with torch.no_grad():
        m.lm_head.weight[EOS] *= 3.0
    return m


@pytest.fixture(scope="module")
def src():
    g = torch.Generator().manual_seed(1)
    s = torch.randint(4, V, (6, 9), generator=g)
    for row, length in enumerate([9, 7, 3, 5, 1, 8]):
        s[row, length:] = PAD
    return s


def test_outputs_end_at_varied_lengths(model, src):
    lengths = {len(x) for x in greedy_search(model, src, BOS, EOS, limit=20)}
    assert len(lengths) >= 3 and min(lengths) < 20  # the fixture exercises <eos>, not only the limit


def test_beam_of_one_is_greedy(model, src):
    greedy = greedy_search(model, src, BOS, EOS, limit=20)
    beam = beam_search(model, src, BOS, EOS, beam_size=1, limit=20)
    assert [h[0].tokens for h in beam] == greedy


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_cached_equals_uncached(model, src, search):
    if search == "greedy":
        cached = greedy_search(model, src, BOS, EOS, limit=20)
        assert cached == greedy_search(model, src, BOS, EOS, limit=20, use_cache=False)
    else:
        a = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, limit=20)
        b = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, limit=20, use_cache=False)
        assert [[h.tokens for h in x] for x in a] == [[h.tokens for h in x] for x in b]
        for x, y in zip(a, b):
            assert [h.score for h in x] == pytest.approx([h.score for h in y], abs=1e-4)


def test_beam_without_cache_reorder_is_wrong(model, src, monkeypatch):
    """The test above can fail: a beam search that does not reorder the cache gives other outputs."""
    right = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, limit=20)
    reorder = type(model).reorder_cache

    def without_following(self, indices, sources=None):
        # The rows of the sentences still decoding, but each hypothesis keeps its own row's past
        # instead of its parent's (rows i * 4 + j, j = 0..3, for each sentence i left). The first
        # step's one row per sentence still fans out to its 4 rows.
        if indices.shape[0] <= self.decoder_layers[0].self_attn.cache.k.shape[0]:
            indices = indices // 4 * 4 + torch.arange(indices.shape[0]) % 4
        reorder(self, indices, sources)

    monkeypatch.setattr(type(model), "reorder_cache", without_following)
    wrong = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, limit=20)
    assert [[h.tokens for h in x] for x in wrong] != [[h.tokens for h in x] for x in right]


def test_batch_equals_one_by_one(model, src):
    batch = beam_search(model, src, BOS, EOS, beam_size=4, n_best=3, limit=20)
    greedy = greedy_search(model, src, BOS, EOS, limit=20)
    for i in range(src.shape[0]):
        alone = src[i:i + 1, : int((src[i] != PAD).sum())]
        one = beam_search(model, alone, BOS, EOS, beam_size=4, n_best=3, limit=20)[0]
        assert [h.tokens for h in one] == [h.tokens for h in batch[i]]
        assert [h.score for h in one] == pytest.approx([h.score for h in batch[i]], abs=1e-4)
        assert greedy_search(model, alone, BOS, EOS, limit=20)[0] == greedy[i]


def test_scores_match_rescoring_with_teacher_forcing(model, src):
    alpha = 0.6
    hyps = beam_search(model, src, BOS, EOS, beam_size=4, n_best=4, alpha=alpha, limit=20)
    for i, hs in enumerate(hyps):
        assert [h.score for h in hs] == sorted((h.score for h in hs), reverse=True)
        for h in hs:
            tgt = torch.tensor([[BOS] + h.tokens])
            gold = torch.tensor(h.tokens + [EOS])
            with torch.no_grad():
                logp = F.log_softmax(model(src[i:i + 1], tgt)[0], dim=-1)  # (T, V)
            logprob = float(logp.gather(1, gold[:, None]).sum())
            assert h.logprob == pytest.approx(logprob, abs=1e-4)
            assert h.score == pytest.approx(logprob / length_penalty(len(h.tokens) + 1, alpha), abs=1e-4)


def test_beam_finds_at_least_greedys_probability_without_length_penalty(model, src):
    greedy = greedy_search(model, src, BOS, EOS, limit=20)
    beam = beam_search(model, src, BOS, EOS, beam_size=4, alpha=0.0, limit=20)
    for i, g in enumerate(greedy):
        with torch.no_grad():
            logp = F.log_softmax(model(src[i:i + 1], torch.tensor([[BOS] + g]))[0], dim=-1)
        greedy_logprob = float(logp.gather(1, torch.tensor(g + [EOS])[:, None]).sum())
        assert beam[i][0].logprob >= greedy_logprob - 1e-5


@pytest.mark.parametrize("vocab", [3, 24, 64, 130, 8000])
def test_best_continuations_equal_a_topk_over_every_candidate(vocab):
    # The chunked search against the plain one: same scores, beams and tokens, for vocabularies that
    # fill one chunk, several, and end in a shorter one; with hypotheses at -inf (step 0) and a row
    # where only one token is allowed (at the length limit).
    g = torch.Generator().manual_seed(vocab)
    n, k = 5, 4
    logp = torch.randn(n, k, vocab, generator=g).log_softmax(-1)
    scores = -torch.rand(n, k, generator=g) * 10
    scores[0, 1:] = float("-inf")
    logp[1, 2, 1:] = float("-inf")
    m = min(2 * k, k * vocab)
    want, ids = (logp + scores[:, :, None]).view(n, k * vocab).topk(m, dim=-1)
    top, beam, token = _best_continuations(logp, scores, m, chunk=16)
    assert torch.equal(top, want)
    finite = torch.isfinite(want)
    assert torch.equal(beam[finite], (ids // vocab)[finite]) and torch.equal(token[finite], (ids % vocab)[finite])


def test_continuations_stay_in_their_parents_rows():
    parents = torch.tensor([[0, 0, 0, 0], [2, 1, 2, 3], [3, 2, 1, 0], [1, 1, 3, 3]])
    order = _stay_in_place(parents)
    assert sorted(order[0].tolist()) == [0, 1, 2, 3]  # a permutation of the continuations
    rows = parents.gather(1, order)  # the parent of the continuation in each row
    assert rows.tolist() == [[0, 0, 0, 0], [2, 1, 2, 3], [0, 1, 2, 3], [1, 1, 3, 3]]
    # Each parent keeps its row for its best continuation; the others fill rows in order.
    assert order.tolist() == [[0, 1, 2, 3], [2, 1, 0, 3], [3, 2, 1, 0], [1, 0, 3, 2]]


def test_continuations_stay_in_place_for_any_parents():
    # Against the rule written out in Python, over every parent pattern of k = 4 and random ones of k = 6.
    def reference(row_parents):
        k = len(row_parents)
        order, others = [None] * k, []
        for j, parent in enumerate(row_parents):
            if order[parent] is None:
                order[parent] = j
            else:
                others.append(j)
        for row, j in zip([r for r in range(k) if order[r] is None], others):
            order[row] = j
        return order

    every = torch.cartesian_prod(*[torch.arange(4)] * 4)  # (256, 4)
    random = torch.randint(0, 6, (200, 6), generator=torch.Generator().manual_seed(0))
    for parents in (every, random):
        assert _stay_in_place(parents).tolist() == [reference(p) for p in parents.tolist()]


def test_survivors_keep_their_places():
    done = torch.tensor([False, True, False, True, False, False])
    keep = _survivors(done)
    assert sorted(keep.tolist()) == [0, 2, 4, 5]
    assert keep.tolist() == [0, 4, 2, 5]  # 0 and 2 stay; 4 and 5 fill the places of 1 and 3
    assert _survivors(torch.tensor([True, True])).tolist() == []
    assert _survivors(torch.tensor([False, False])).tolist() == [0, 1]


def test_length_penalty_is_gnmt():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(10, 0.0) == 1.0


def test_max_length_is_source_plus_50_capped_by_positions():
    s = torch.tensor([[5, 6, 7, PAD], [5, PAD, PAD, PAD]])
    assert max_new_tokens(s, PAD, model_max_len=1000).tolist() == [53, 51]
    assert max_new_tokens(s, PAD, model_max_len=40).tolist() == [39, 39]
    assert max_new_tokens(s, PAD, model_max_len=1000, limit=5).tolist() == [5, 5]


class _NoEos(torch.nn.Module):
    """The output projection with <eos> pushed far down: the model never wants to stop."""

    def __init__(self, generator):
        super().__init__()
        self.generator = generator

    def forward(self, x):
        logits = self.generator(x)
        logits[..., EOS] -= 100.0
        return logits


def test_limit_forces_eos(model, src):
    """With <eos> made unlikely, every output stops exactly at its limit."""
    generator = model.lm_head
    model.lm_head = _NoEos(generator)
    try:
        out = greedy_search(model, src, BOS, EOS, limit=6)
        beams = beam_search(model, src, BOS, EOS, beam_size=3, limit=6)
        # Default: source length + 50, capped by the 40 positions (39 after <bos>).
        lengths = [len(x) for x in greedy_search(model, src, BOS, EOS)]
    finally:
        model.lm_head = generator
    assert [len(x) for x in out] == [6] * src.shape[0]
    assert all(len(h[0].tokens) == 6 for h in beams)
    assert lengths == [39] * src.shape[0]


def test_nbest_and_beam_arguments_checked(model, src):
    with pytest.raises(ValueError, match="n_best"):
        beam_search(model, src, BOS, EOS, beam_size=2, n_best=3)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, src, BOS, EOS, beam_size=0)


def test_search_leaves_model_as_it_was(model, src):
    model.train()
    greedy_search(model, src, BOS, EOS, limit=5)
    beam_search(model, src, BOS, EOS, beam_size=2, limit=5)
    assert model.training
    assert all(m.cache is None for m in model.modules() if hasattr(m, "cache"))
    model.eval()
    assert padding_mask(src, PAD).shape == (6, 1, 1, 9)


def test_a_model_whose_scores_are_all_nan_is_a_clear_error_not_an_empty_result(model, src):
    broken = Transformer(model.cfg).eval()
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="scores are not finite"):
        beam_search(broken, src, BOS, EOS, beam_size=2, limit=5)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf"), -0.5])
def test_the_length_penalty_must_be_finite_and_not_negative(model, src, alpha):
    with pytest.raises(ValueError, match="alpha"):
        beam_search(model, src, BOS, EOS, beam_size=2, alpha=alpha, limit=5)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_step_reads_one_number_back_from_the_device(model, src, monkeypatch, search):
    """The searches' bookkeeping stays on the device: from the first step to the building of the results,
    each step reads back only how many sentences are done (the caches' reorder reads which rows moved,
    through ``nonzero``, which this does not count)."""
    import qkv.generation.beam as beam

    reads = []
    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist"):
        real = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _real=real: reads.append(1) or _real(self, *a))
    steps, at = [], {}  # reads so far at the first step, and where the results are built
    real_decode = type(model).decode

    def decode(self, *args, **kwargs):
        at.setdefault("first step", len(reads))
        steps.append(1)
        return real_decode(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "decode", decode)
    results = "_greedy_outputs" if search == "greedy" else "_finished_hypotheses"
    real_results = getattr(beam, results)

    def build(*args):
        at["results"] = len(reads)
        return real_results(*args)

    monkeypatch.setattr(beam, results, build)
    if search == "greedy":
        greedy_search(model, src, BOS, EOS, limit=20)
    else:
        beam_search(model, src, BOS, EOS, beam_size=4, n_best=2, limit=20)
    assert len(steps) > 3
    assert at["results"] - at["first step"] == len(steps)
