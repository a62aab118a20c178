"""The embedded demo corpus: deterministic, split without leaks, unseen combinations in test, learnable."""

from __future__ import annotations

import re

import pytest

from qkv.data import synthetic as syn


@pytest.fixture(scope="module")
def corpus():
    return syn.demo_corpus(seed=0)


def _words(sentences, lang):
    if lang == "en":
        return {w for s in sentences for w in re.findall(r"[A-Za-z]+", s)}
    return {ch for s in sentences for ch in s}


def test_seed_sentence_is_produced_by_the_generator():
    ex = syn.Example("state_wish", "小明", state="累了", wish="睡觉")
    assert ex.render() == syn.SEED_SENTENCE == ("小明累了，他想睡觉。", "Xiaoming is tired, he wants to sleep.")
    # And it is among the sentences the templates can generate, as a held-out (unseen) one.
    rendered = {e.render(): e for e in syn.all_examples()}
    assert syn.SEED_SENTENCE in rendered and rendered[syn.SEED_SENTENCE].held_out


def test_unseen_examples_are_generatable_held_out_and_in_test(corpus):
    rendered = {e.render(): e for e in syn.all_examples()}
    train = set(zip(*corpus["train"]))
    test = list(zip(*corpus["test"]))
    for pair in syn.UNSEEN_EXAMPLES:
        assert pair in rendered, pair
        assert rendered[pair].held_out, pair
        assert pair in test and pair not in train


def test_time_and_place_move_after_the_verb_in_english():
    zh, en = syn.Example("time_place", "小红", wish="吃饭", place="在学校", time="明天").render()
    assert zh == "小红明天在学校想吃饭。"
    assert en == "Xiaohong wants to eat at school tomorrow."
    zh, en = syn.Example("because", "小刚", state="饿了", wish="喝水").render()
    assert (zh, en) == ("因为小刚饿了，所以他想喝水。", "Xiaogang wants to drink water because he is hungry.")


def test_deterministic_by_seed():
    a = syn.demo_corpus(seed=3, n_train=300, n_valid=50, n_test=50)
    b = syn.demo_corpus(seed=3, n_train=300, n_valid=50, n_test=50)
    c = syn.demo_corpus(seed=4, n_train=300, n_valid=50, n_test=50)
    assert a == b
    assert a["train"] != c["train"]
    assert syn.make_pairs(100, seed=1) == syn.make_pairs(100, seed=1) != syn.make_pairs(100, seed=2)


def test_sizes_and_alignment(corpus):
    assert [len(corpus[s][0]) for s in ("train", "valid", "test")] == [20000, 500, 500]
    for zh, en in corpus.values():
        assert len(zh) == len(en)


def test_splits_do_not_overlap(corpus):
    pairs = {s: set(zip(*corpus[s])) for s in corpus}
    assert len(pairs["train"]) == len(corpus["train"][0])  # no duplicates either
    assert not pairs["train"] & pairs["valid"]
    assert not pairs["train"] & pairs["test"]
    assert not pairs["valid"] & pairs["test"]
    # Not even the source side repeats: each Chinese sentence has one English rendering.
    zh = {s: set(corpus[s][0]) for s in corpus}
    assert not zh["train"] & (zh["valid"] | zh["test"])


def test_held_out_combinations_only_outside_train(corpus):
    by_zh = {e.render()[0]: e for e in syn.all_examples()}
    assert not any(by_zh[zh].held_out for zh in corpus["train"][0])
    assert all(by_zh[zh].held_out for zh in corpus["test"][0])
    assert all(by_zh[zh].held_out for zh in corpus["valid"][0])
    # Every held-out combination is actually tested somewhere, so none is dead weight.
    tested = set().union(*(by_zh[zh].combos() for zh in corpus["test"][0] + corpus["valid"][0]))
    assert syn.HELD_OUT <= tested


def test_every_test_word_occurs_in_training(corpus):
    for side, lang in ((0, "zh"), (1, "en")):
        train_words = _words(corpus["train"][side], lang)
        for split in ("valid", "test"):
            missing = _words(corpus[split][side], lang) - train_words
            assert not missing, (split, lang, missing)


def test_every_held_out_word_is_seen_with_other_people(corpus):
    by_zh = {e.render()[0]: e for e in syn.all_examples()}
    seen = set().union(*(by_zh[zh].combos() for zh in corpus["train"][0]))
    for person, word in syn.HELD_OUT:
        assert any(w == word and p != person for p, w in seen), word


def test_pronouns_agree_with_their_antecedent_and_the_gold_link_is_right():
    """Every pattern's gold link: the pronoun (Chinese and English) has its antecedent's gender, the
    antecedent is one of the sentence's names, and only where no Chinese word genders the pronoun does
    the translation need the antecedent."""
    gender = {zh: g for zh, _, g in syn.PEOPLE}
    english = {zh: en for zh, en, _ in syn.PEOPLE}
    linked, by_template = 0, {}
    for ex in syn.all_examples():
        zh, en = ex.render()
        words = re.findall(r"[A-Za-z]+", en)
        assert words[0] in english.values() or ex.template in ("swapped", "because_zero", "because_zero_two")
        link = ex.link()
        if link is None:  # no pronoun in either language
            assert not {"he", "she", "He", "She"} & set(words) and "他" not in zh and "她" not in zh, (zh, en)
            continue
        linked += 1
        g = gender[link["antecedent"]]
        assert link["antecedent"] in link["candidates"] and all(c in zh for c in link["candidates"])
        assert link["en"].lower() == {"m": "he", "f": "she"}[g]
        assert [w for w in words if w.lower() in ("he", "she")] == [link["en"]], (zh, en)
        if link["zh"] in ("他", "她"):
            assert link["zh"] == {"m": "他", "f": "她"}[g] and zh.count(link["zh"]) == 1
        assert link["needs_antecedent"] == (link["zh"] not in ("他", "她")), (zh, link)
        assert english[link["antecedent"]] in en
        if len(link["candidates"]) == 2:  # the other candidate has the other gender: the pronoun decides
            a, b = link["candidates"]
            assert gender[a] != gender[b]
        by_template.setdefault(ex.template, set()).add((link["zh"], link["needs_antecedent"]))
    assert linked > 0.8 * len(syn.all_examples())
    assert by_template["zero"] == {(None, True)} and by_template["tell_self"] == {("自己", True)}
    # Cataphora: the English pronoun before its name, no Chinese word to gender it.
    assert by_template["because_zero"] == by_template["because_zero_two"] == {(None, True)}
    for ex in syn.all_examples():
        if ex.template.startswith("because_zero"):
            en = ex.render()[1]
            assert en.index(ex.link()["en"]) < en.index(english[ex.link()["antecedent"]]), en
    assert {zh for zh, _ in by_template["two"]} == {"他", "她"}
    # "two": the pronoun is the first person's in some sentences and the second's in others.
    two = [ex for ex in syn.all_examples() if ex.template == "two"]
    assert {ex.refers_to_other for ex in two} == {False, True}


def test_the_swapped_sentence_of_the_article():
    ex = syn.Example("swapped", "小明", state="累了", wish="睡觉")
    assert ex.render() == ("他累了，小明想睡觉。", "He is tired, Xiaoming wants to sleep.")
    assert ex.link()["antecedent"] == "小明" and ex.link()["zh"] == "他"


def test_one_english_rendering_per_chinese_sentence():
    seen: dict[str, str] = {}
    for ex in syn.all_examples():
        zh, en = ex.render()
        assert seen.setdefault(zh, en) == en, zh
        assert en[0].isupper() and en.endswith(".") and zh.endswith("。")


def test_vocabulary_is_small():
    zh, en = zip(*(e.render() for e in syn.all_examples()))
    assert len(_words(zh, "zh")) < 120
    assert len(_words(en, "en")) < 100


def test_asking_for_too_much_is_a_clear_error():
    with pytest.raises(ValueError, match="could not draw"):
        syn.demo_corpus(n_train=10, n_valid=10, n_test=100000)


def test_the_demo_corpus_as_instruction_pairs_for_fine_tuning():
    from qkv.data.sft import load_pairs
    from qkv.data.synthetic import DEMO, SEED_SENTENCE, demo_corpus
    from qkv.errors import DataError

    splits = demo_corpus()
    for split in ("train", "valid", "test"):
        pairs = load_pairs(f"{DEMO}:{split}")
        zh, en = splits[split]
        assert [p.prompt for p in pairs] == [f"Chinese: {s}\nEnglish:" for s in zh]
        assert [p.response for p in pairs] == [f" {s}" for s in en]
    assert load_pairs(f"{DEMO}:test")[0].prompt == f"Chinese: {SEED_SENTENCE[0]}\nEnglish:"
    with pytest.raises(DataError, match="the demo corpus has the splits"):
        load_pairs(f"{DEMO}:dev")


def test_zh_words_cover_every_template_and_the_demo_tokenizer_keeps_them_whole(corpus):
    from qkv.data.translation import train_joint_bpe

    punctuation = "，。"
    glue = re.compile("(?:" + "|".join(sorted(syn.GLUE, key=len, reverse=True)) + ")+")
    for zh, _ in syn.TEMPLATES.values():
        literal = re.sub(r"\{\w+\}", "|", zh)
        for chunk in filter(None, re.split(rf"[|{punctuation}]", literal)):
            assert glue.fullmatch(chunk), (zh, chunk)  # every word between the slots is a glue word
    words = sorted(syn.ZH_WORDS, key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, words)) + f"|[{punctuation}]")
    tok = train_joint_bpe(*corpus["train"], 400, syn.DEMO)
    for zh in corpus["train"][0][:300] + corpus["test"][0][:100]:
        pieces = pattern.findall(zh)
        assert "".join(pieces) == zh  # the sentence is exactly a sequence of the generator's words
        # ... and every token lies inside one of them.
        bounds, at = set(), 0
        for piece in pieces:
            at += len(piece)
            bounds.add(at)
        at = 0
        for t in (tok.id_to_token(i) for i in tok.encode(zh)):
            start, at = at, at + len(t)
            assert not any(start < b < at for b in bounds), (zh, t)
    seed = [tok.id_to_token(i) for i in tok.encode(syn.SEED_SENTENCE[0])]
    assert seed == ["小明", "累了", "，", "他", "想", "睡觉", "。"]
