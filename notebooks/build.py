"""Writes the tutorials, each in Chinese (notebooks/zh/) and English (notebooks/en/), from one source:
the same code cells, the text in both languages. Run it after changing a tutorial:

    python notebooks/build.py           # the notebooks, without outputs
    python notebooks/build.py --html    # also run each and write docs/notebooks/LANG/NAME.html

The notebooks are committed without outputs; tests/test_notebooks.py checks that they are what this
file writes, then runs every one from top to bottom (its assertions are the tutorial's checks). The
HTML renderings are for reading without Jupyter: self-contained (no script or font is fetched), the
attention views included.
"""

from __future__ import annotations

import hashlib
import html
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat

HTML_DIR = Path(__file__).resolve().parent.parent / "docs" / "notebooks"
TIMEOUT_S = 600  # a cell, at most: the first trains the demo (about a minute on two cores)

HERE = Path(__file__).resolve().parent
LANGS = ("zh", "en")


# A line break between two Chinese characters: Markdown renders a break as a space, which Chinese text does not
# have, so the source's lines are joined there (a break next to a Latin word or code stays a space).
_CJK_BREAK = re.compile(r"(?<=[^\x00-\x7f])\n(?=[^\x00-\x7f])")


def md(zh: str, en: str) -> tuple[str, str, str]:
    return ("markdown", _CJK_BREAK.sub("", zh.strip()), en.strip())


def code(source: str) -> tuple[str, str, str]:
    return ("code", source.strip(), source.strip())


# ---------------------------------------------------------------------------------------------------
# 1. 他是怎么找到小明的 / How does the model know 他 is 小明?

WHO_IS_HE = [
    md("""
# 他是怎么找到小明的

文章一的问题是它的标题：模型怎么知道“小明累了，他想睡觉”里的“他”是小明？文章用手算的小向量回答：“他”的查询
（query）去和每个词的键（key）比，和“小明”的键最像，于是“他”读走了“小明”的值（value）。

这个 notebook 把同样的几步放到一个**真的训练出来的模型**上：`qkv demo` 训练的中译英 Transformer（2+2 层，
d_model 128，4 个头）。每一步我们都自己用 torch 算一遍，再和模型自己算的结果对一下——对不上，notebook 就会报错。

每一节对应文章一的一节（「注意力：带着问题去查」「分数为什么要缩小」「多头」「位置：注意力分不清顺序」
「编码器和解码器」「训练一次算完，生成只能一个一个来」），也对应论文《Attention Is All You Need》的第 3 节。
""", """
# How does the model know 他 is 小明?

The first article's question is its title: in 小明累了，他想睡觉 ("Xiaoming is tired, he wants to sleep"), how
does the model know that 他 (he) is 小明? The article answers with small vectors worked by hand: 他's query is
compared with every word's key, 小明's key fits best, so 他 reads 小明's value.

This notebook takes the same steps on a **model that was really trained**: the Chinese -> English
Transformer that `qkv demo` trains (2+2 layers, d_model 128, 4 heads). Each step is computed by hand with torch
and then checked against what the model computes itself: if they differ, the notebook stops with an error.

Each part follows a section of the first article (attention as asking a question, why the scores are
scaled, multi-head, positions, encoder and decoder, training at once and generating one token at a
time) and Section 3 of "Attention Is All You Need".
"""),
    md("""
## 1. 一个训练好的模型

这个笔记本写的所有文件都放在它旁边的 `runs/` 里（git 不管这个文件夹）。如果 `runs/demo` 里还没有训练完的模型
（没有，或者上次训练到一半被打断了），下面这格会重新训练一个（两核 CPU 上一分钟左右）；有的话直接读进来。
""", """
## 1. A trained model

Everything this notebook writes goes into `runs/` beside it (a folder git ignores). If `runs/demo` holds no
finished model yet (none, or a training stopped part way), the next cell trains one (about a minute on two CPU
cores); otherwise it is loaded.
"""),
    code("""
import math
from pathlib import Path

import torch

from qkv.demo import run_demo
from qkv.generation.api import Translator
from qkv.interpret import capture_attention, show
from qkv.runs import Run

torch.set_num_threads(2)
RUN = Path("runs/demo")
if not Run(RUN).exists:   # not trained, or stopped part way: the demo trains it again from the start
    run_demo(RUN, quiet=True)
translator = Translator.from_run(RUN, device="cpu")
model, tok = translator.model, translator.tokenizer
cfg = model.cfg
print(f"d_model {cfg.d_model}, {cfg.n_heads} heads, d_k {cfg.d_model // cfg.n_heads}, {cfg.n_layers}+{cfg.decoder_layers} layers")
print(translator.translate("小明累了，他想睡觉。", beam=1))
"""),
    md("""
## 2. 句子变成向量

分词器把每个词当成一个 token，所以“他”是单独的一行。每个 token 的向量是它的词向量乘以 √d_model，再加上它的
位置编码（论文 3.4 节、3.5 节）。这就是编码器第一层看到的 X。
""", """
## 2. From words to vectors

The tokenizer keeps each word whole, so 他 is a row of its own. A token's vector is its embedding times
√d_model plus the encoding of its position (Sections 3.4 and 3.5 of the paper). This is the X the
encoder's first layer sees.
"""),
    code("""
sentence = "小明累了，他想睡觉。"
src = torch.tensor(translator.encode_sources([sentence]))          # (1, S): the tokens and <eos>
tokens = [tok.id_to_token(i).replace("▁", "") for i in src[0].tolist()]
print(tokens)
he, xiaoming = tokens.index("他"), tokens.index("小明")

with torch.no_grad():
    X = model.token_embedding(src)[0] * math.sqrt(cfg.d_model) + model.positional(src.shape[1])   # (S, d_model)
    assert torch.allclose(X, model.embed(src)[0], atol=1e-6)       # what the model itself feeds its encoder
print(X.shape, "the row of 他:", X[he, :4])
"""),
    md("""
## 3. 他的查询，每个词的键和值

编码器第一层的自注意力有三个矩阵 W^Q、W^K、W^V（qkv 把它们叠在 `in_proj` 里）。q = x W^Q 是“他”要问的问题，
k = x W^K 是每个词拿来被比较的标签，v = x W^V 是每个词真正交出去的内容（文章一「注意力：带着问题去查」）。

先看第 0 个头：它的 q、k 各有 d_k = 32 维。分数是 q·k，再除以 √d_k（文章一「分数为什么要缩小」：不缩小，
d_k 一大，softmax 就只剩一个 1），softmax 之后就是“他”放在每个词上的注意力。
""", """
## 3. 他's query, every word's key and value

Self-attention in the encoder's first layer has three matrices W^Q, W^K, W^V (qkv stacks them in `in_proj`).
q = x W^Q is the question 他 asks, k = x W^K the label each word is compared by, v = x W^V what each word hands
over (the article's section on attention as asking a question).

Take head 0 first: its q and k have d_k = 32 components. A score is q·k divided by √d_k (the article's section
on why scores are scaled: unscaled, a large d_k leaves softmax with a single 1); after softmax, these are the
weights 他 puts on every word.
"""),
    code("""
attn = model.encoder_layers[0].self_attn
H, d = cfg.n_heads, cfg.d_model
d_k = d // H
W = attn.in_proj.weight.detach()          # (3 d_model, d_model): W^Q, W^K, W^V stacked
b = attn.in_proj.bias.detach()
W_Q, W_K, W_V = W[:d], W[d:2 * d], W[2 * d:]
b_Q, b_K, b_V = b[:d], b[d:2 * d], b[2 * d:]

with torch.no_grad():
    Q = (X @ W_Q.T + b_Q).view(-1, H, d_k).transpose(0, 1)   # (H, S, d_k)
    K = (X @ W_K.T + b_K).view(-1, H, d_k).transpose(0, 1)
    V = (X @ W_V.T + b_V).view(-1, H, d_k).transpose(0, 1)

head = 0
scores = Q[head, he] @ K[head].T / math.sqrt(d_k)              # (S,): 他 against every word
weights = torch.softmax(scores, dim=-1)
for t, s, w in zip(tokens, scores.tolist(), weights.tolist()):
    print(f"{t:>4}  score {s:6.2f}  weight {w:.3f}")
"""),
    md("""
模型自己算出的注意力权重可以用 `capture_attention` 拿到。我们手算的这一行必须和它一样：
""", """
The weights the model computes itself come out of `capture_attention`. The row we computed by hand must equal
it:
"""),
    code("""
with torch.no_grad(), capture_attention(model) as maps:
    model(src, torch.tensor([[tok.bos_id]]))
own = maps["encoder_self"][0][0]           # layer 0: (H, S, S)
assert torch.allclose(weights, own[head, he], atol=1e-5)
print("by hand:", [round(w, 3) for w in weights.tolist()])
print("model:  ", [round(w, 3) for w in own[head, he].tolist()])
"""),
    md("""
## 4. 每个头读走一份值，拼起来再乘 W^O

“他”的输出是这些权重对值的加权和：o = Σ 权重 × v。4 个头各算一份（每份 32 维），拼成 128 维，再乘 W^O
（文章一「多头」；论文 3.2.2 节）。结果必须等于模型这一层注意力的输出。
""", """
## 4. Each head reads its share of the values; concatenated, then W^O

他's output is the weighted sum of the values: o = Σ weight × v. Each of the 4 heads computes one (32
components), they are concatenated to 128 and multiplied by W^O (the article's multi-head section; Section
3.2.2 of the paper). The result must equal this layer's attention output in the model.
"""),
    code("""
with torch.no_grad():
    every_head = torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(d_k), dim=-1) @ V   # (H, S, d_k)
    concat = every_head.transpose(0, 1).reshape(-1, d)                                # (S, d_model)
    O = concat @ attn.out_proj.weight.T + attn.out_proj.bias
    theirs, _ = attn(X.unsqueeze(0))                                                  # the model's own layer
assert torch.allclose(O, theirs[0], atol=1e-5)
print("他's output, first 4 of 128:", O[he, :4])
print("every head's weight on 小明:", [round(float(own[h, he, xiaoming]), 3) for h in range(H)])
"""),
    md("""
最后一行是四个头各自放在“小明”上的权重。这个模型的编码器里，没有一个头把“他”的大部分注意力放在“小明”上：
“他”自己就说明了英文是 he，编码器不需要找先行词。需要先行词的是没有“他”的句子（“小明累了，想睡觉。”），
那时去找“小明”的是解码器第二层的交叉注意力（第 7 节；docs/EXPERIMENTS.md 量过三个随机种子）。
""", """
The last line is the weight each of the four heads puts on 小明. In this model's encoder no head puts most of
他's attention on 小明: 他 already says the English is he, so the encoder has no antecedent to find. The
sentences that need one are those without 他 (小明累了，想睡觉。), and there it is the cross-attention of the
decoder's second layer that finds 小明 (section 7; docs/EXPERIMENTS.md measures it over three seeds).
"""),
    md("""
## 5. 位置：打乱词序，注意力会不会变

注意力本身不看顺序：把 X 的行换个顺序，每个词得到的权重只是跟着换位置（文章一「位置：注意力分不清顺序」）。
模型能分出“小明累了，他想睡觉”和“他累了，小明想睡觉”，靠的是加进 X 的位置编码。下面把两句话都去掉位置编码
算一次，再带着位置编码算一次。
""", """
## 5. Positions: does reordering the words change attention?

Attention itself does not see order: permute the rows of X and every word's weights are only permuted with
them (the article's section on positions). The model tells 小明累了，他想睡觉 from 他累了，小明想睡觉 by the
position encodings added to X. Below, both sentences once without them, once with them.
"""),
    code("""
swapped = "他累了，小明想睡觉。"
src2 = torch.tensor(translator.encode_sources([swapped]))
tokens2 = [tok.id_to_token(i).replace("▁", "") for i in src2[0].tolist()]
order = [tokens.index(t) for t in tokens2]                 # where each word of the swapped sentence was

def weights_of(ids, with_positions):
    with torch.no_grad():
        x = model.token_embedding(ids)[0] * math.sqrt(d)
        if with_positions:
            x = x + model.positional(ids.shape[1])
        q = (x @ W_Q.T + b_Q).view(-1, H, d_k).transpose(0, 1)
        k = (x @ W_K.T + b_K).view(-1, H, d_k).transpose(0, 1)
        return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d_k), dim=-1)   # (H, S, S)

a, b2 = weights_of(src, False), weights_of(src2, False)
assert torch.allclose(b2, a[:, order][:, :, order], atol=1e-5)      # without positions: only permuted
a, b2 = weights_of(src, True), weights_of(src2, True)
print("with positions, largest change of a weight:", float((b2 - a[:, order][:, :, order]).abs().max()))
print(translator.translate([sentence, swapped], beam=1))
"""),
    md("""
## 6. 解码器：掩码，和一次算完的训练

解码器的自注意力带掩码：写第 t 个词的时候只能看前面已经写出的词（论文 3.2.3 节）。训练时整句译文一次送进去
（teacher forcing），每个位置同时预测下一个词；生成时只能一个一个来，每一步把刚写出的词接上去再算
（文章一「编码器和解码器」「训练一次算完，生成只能一个一个来」）。

检查两件事：解码器自注意力在对角线右上方全是 0；把模型自己一步一步生成的译文整句送进去，一次算出的每个位置的
最可能的词，正好是生成时每一步写出的词。
""", """
## 6. The decoder: the mask, and training in one pass

The decoder's self-attention is masked: writing the t-th word it sees only the words already written
(Section 3.2.3 of the paper). In training the whole reference goes in at once (teacher forcing) and every
position predicts its next word at the same time; generating, the words come one at a time, each step fed the
word just written (the article's sections on encoder and decoder, and on training and generating).

Two checks: the decoder's self-attention is 0 everywhere above the diagonal; and feeding the model's own
translation in one pass, the most likely word at every position is exactly the word generation wrote at that
step.
"""),
    code("""
generated = []                                   # one token at a time, as generation does
ys = [tok.bos_id]
with torch.no_grad():
    for _ in range(40):
        logits = model(src, torch.tensor([ys]))[0, -1]
        nxt = int(logits.argmax())
        ys.append(nxt)
        if nxt == tok.eos_id:
            break
    with capture_attention(model) as maps:
        once = model(src, torch.tensor([ys[:-1]]))[0].argmax(-1)   # every position in one pass
print(tok.decode(ys[1:-1]))
assert once.tolist() == ys[1:]
for layer in maps["decoder_self"]:
    assert float(torch.triu(layer[0], diagonal=1).abs().max()) == 0.0
print("teacher forcing equals generation, and no position looks ahead")
"""),
    md("""
## 7. 哪个头在找先行词

没有“他”的句子怎么办？“小明累了，想睡觉。”里没有“他”，英文却要写 he 还是 she，只有“小明”能决定。
`qkv explain`（这里直接调用它的函数，半分钟左右）在几百个训练时没见过的句子上，给每一层、每一个头打分：
写 he/she 的那一行，最大的权重是不是落在先行词上；再把头关掉，看 he/she 会不会变。
""", """
## 7. Which head finds the antecedent

And where there is no 他? 小明累了，想睡觉。 has none, yet only 小明 can say whether the English writes he or
she. `qkv explain` (its functions called here, about half a minute) scores every layer and head on hundreds
of sentences never seen in training: from the row that writes he/she, is the largest weight on the
antecedent? Then it switches heads off and watches whether he/she changes.
"""),
    code("""
from qkv.experiments import pronouns

if not (RUN / "pronouns.json").is_file():
    pronouns.write(pronouns.explain(RUN), RUN)
import json
results = json.loads((RUN / "pronouns.json").read_text(encoding="utf-8"))
best, seed = results["best"], results["seed_sentence"]
print(f"best head: {best['kind']} layer {best['layer']} head {best['head']}, largest weight on the antecedent "
      f"for {100 * best['share']:.0f}% of {best['n']} pronouns ({100 * best['share_two']:.0f}% with two candidates)")
print(f"on {seed['sentence']}: {100 * seed['weight']:.0f}% on {seed['token']}")
peers = [tuple(h) for h in results["sets"][0]["heads"]]
print(f"switched off alone: {100 * best['flip']:.0f}% of the pronouns change; with {peers}: "
      f"{100 * results['sets'][0]['flip']:.0f}%")
"""),
    md("""
## 8. 在你训练的模型里看注意力

`show` 把模型的每一层、每一个头画在这里（和 `qkv explore` 的第 11 张图一样），并且直接打开上面找到的那个头：
看写 he 的那一行落在哪里。第二张图把找先行词的几个头一起关掉，再翻译一次“因为累了，小明想睡觉。”——
英文的 he 在“小明”之前就要写出来，这时只有这几个头能告诉解码器是谁累了。
""", """
## 8. Attention in the model you trained

`show` draws every layer and head of the model here (as figure 11 of `qkv explore` does), opened on the head
found above: see where the row that writes he looks. The second view switches off the heads that find the
antecedent together and translates 因为累了，小明想睡觉。 again: the English he comes before Xiaoming, and
then only these heads can tell the decoder who is tired.
"""),
    code("""
show(RUN, seed["sentence"], lang=LANG)
"""),
    code("""
show(RUN, "因为累了，小明想睡觉。", off=peers, lang=LANG)
"""),
]

# ---------------------------------------------------------------------------------------------------
# 2. GPT：预测下一个词、微调与灾难性遗忘 / GPT: the next word, fine-tuning and catastrophic forgetting

GPT_FORGETTING = [
    md("""
# GPT：预测下一个词、微调与灾难性遗忘

文章二讲 GPT：只有解码器，训练的目标只有一个——预测下一个词。一句“今天天气很好”就是一串练习题：看到“今”猜“天”，
看到“今天”猜“天”，……每道题的分数是模型给正确答案的概率 p，损失是 −log p（负对数似然）。
然后文章讲微调：在一个小任务上接着训练，模型学会了任务，却可能忘掉预训练学到的东西（灾难性遗忘），
以及两种办法：把预训练的损失混进来，或者用 KL 散度拉住它不要离原来的模型太远。

这个 notebook 在几分钟内把这些都做一遍：一个很小的字级 GPT，在 qkv 自带的中文句子上预训练；在同样的句子的
中译英任务上微调；量它忘掉了多少，再试两种办法。用的函数和 `qkv experiment forgetting` 一样。
""", """
# GPT: the next word, fine-tuning and catastrophic forgetting

The second article is about GPT: a decoder alone, trained for one thing, predicting the next word. One
sentence, 今天天气很好 ("the weather is fine today"), is a string of practice problems: given 今, guess 天; given
今天, guess 天; ... A problem's score is the probability p the model gives the right answer, its loss −log p
(the negative log-likelihood). Then fine-tuning: trained on on a small task, the model learns the task but may
lose what pretraining taught it (catastrophic forgetting); and two cures: mix the pretraining loss back in,
or hold the model near the one it was with a KL divergence.

This notebook does all of it in a few minutes: a tiny character-level GPT pretrained on the Chinese sentences
qkv generates; fine-tuned on translating the same sentences into English; how much it forgot; the two cures.
The functions are those of `qkv experiment forgetting`.
"""),
    md("""
## 1. 练习题

先不用模型：一句话怎么变成练习题。每一个前缀都是一道题，答案是下一个字。
""", """
## 1. Practice problems

No model yet: how a sentence becomes practice problems. Every prefix is a problem, its answer the next
character.
"""),
    code("""
import math
import time
from pathlib import Path

import torch

from qkv.data.sft import load_pairs
from qkv.data.synthetic import demo_corpus
from qkv.experiments.forgetting import score
from qkv.generation.completer import Completer
from qkv.runs import Run, load_model
from qkv.training import recipes
from qkv.training.finetune import FinetuneConfig, FinetuneData, FinetuneRecipe, finetune
from qkv.training.train_lm import train_lm

torch.set_num_threads(2)
article = "今天天气很好"
for i in range(1, len(article)):
    print(f"{article[:i]:　<6} -> {article[i]}")
"""),
    md("""
## 2. 预训练一个很小的 GPT

语料是 qkv 的演示语料里的两万句中文（“小明今天在家想吃饭。”这样的句子）。模型：2 层，d_model 128，4 个头，
每次看 128 个字。词表按字切，也包含后面翻译任务要用到的英文字母。两核 CPU 上半分钟左右。训练每 100 步存一次
检查点：如果中途打断（停止或重启内核），再运行这一格会从最后一个检查点接着训练，结果和一口气训练完一样。
这个笔记本写的所有文件都放在它旁边的 `runs/` 里（git 不管这个文件夹）。
""", """
## 2. Pretraining a tiny GPT

The corpus: the 20,000 Chinese sentences of qkv's demo corpus (sentences such as 小明今天在家想吃饭。). The
model: 2 layers, d_model 128, 4 heads, 128 characters of context. One token per character, the vocabulary
also covering the English letters the translation task will need. About half a minute on two CPU cores. The
training saves a checkpoint every 100 steps: stopped part way (the kernel interrupted or restarted), the cell run
again continues from the last one, to the same model as a run never stopped. Everything this notebook writes goes
into `runs/` beside it (a folder git ignores).
"""),
    code("""
RUNS = Path("runs")   # everything this notebook writes
RUNS.mkdir(exist_ok=True)
chinese = RUNS / "chinese.txt"
chinese.write_text("\\n".join(demo_corpus()["train"][0]) + "\\n", encoding="utf-8")
task_text = RUNS / "task.txt"   # the characters the fine-tuning task will use (the vocabulary covers them)
task_text.write_text("".join(p.prompt + p.response + "\\n" for split in ("train", "valid", "test")
                             for p in load_pairs(f"demo:{split}")), encoding="utf-8")

BASE = RUNS / "gpt-base"
if not Run(BASE).exists:   # not trained, or stopped part way: on from its last checkpoint, or from the start
    recipe = recipes.load("lm", "baby", [
        f"data.path={chinese}", f"data.vocab_extra=['{task_text}']", "model.d_model=128", "model.n_layers=2",
        "model.n_heads=4", "model.d_ff=512", "model.max_len=128", "train.context=128", "train.steps=600",
        "train.decay_steps=600", "train.warmup=20", "train.batch_size=16", "train.eval_every=600",
        "train.checkpoint_every=100", "train.threads=2"])
    resume = Run(BASE).has_checkpoint
    train_lm(recipe, BASE, resume=resume, overwrite=not resume, quiet=True, plot=False)
model, tok = load_model(BASE, device="cpu")
print(sum(p.numel() for p in model.parameters()), "parameters,", tok.vocab_size, "characters")
"""),
    md("""
## 3. 模型做练习题

“今天天气很好”里的“气”和“好”不在这份语料里，所以换一句它见过同类的话。对每一道题，模型给出下一个字的概率；
−log p 就是这道题的损失。把所有题的损失加起来，正好是训练时用的交叉熵（乘以题数）——下面用 `assert` 验证。
容易的题（“吃”后面是“饭”）p 接近 1，难的题（“小明”后面是什么时间、什么地方）p 很小。
""", """
## 3. The model does its practice problems

气 and 好 of 今天天气很好 are not in this corpus, so take a sentence of the kind it has seen. For every
problem the model gives the next character a probability; −log p is that problem's loss. The losses added up
are exactly the cross-entropy used in training (times the number of problems): an `assert` checks it. Easy
problems (饭 after 吃) have p near 1, hard ones (what time or place follows 小明) a small p.
"""),
    code("""
sentence = "小明今天在家想吃饭。"
ids = tok.encode(sentence)
with torch.no_grad():
    logits = model(torch.tensor([ids]))[0]                 # (T, vocabulary): a guess after every prefix
logp = torch.log_softmax(logits, dim=-1)
nll = [-float(logp[i - 1, ids[i]]) for i in range(1, len(ids))]
for i, loss in enumerate(nll, start=1):
    print(f"{sentence[:i]:　<10} -> {sentence[i]}   p = {math.exp(-loss):.3f}   -log p = {loss:.3f}")
xent = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(ids[1:]))
assert abs(sum(nll) / len(nll) - float(xent)) < 1e-5
print("mean -log p:", round(sum(nll) / len(nll), 3))
"""),
    md("""
## 4. 微调：学会翻译，忘掉中文

任务是把演示语料的中文句子译成英文：提示“Chinese: 小明累了。\\nEnglish:”，回答“ Xiaoming is tired.”，
只在回答上算损失。三种微调，步数和学习率都一样（两核 CPU 上每种半分钟到一分钟）：

- `sft`：只用任务的损失；
- `mix`：任务的损失 + λ × 预训练的损失（λ = 1，每步另取一批中文）；
- `kl`：任务的损失 + β × KL(p_base ‖ p)（β = 1，在同样的中文上，让新模型的下一个字的分布别离开原来的模型）。
""", """
## 4. Fine-tuning: learning to translate, forgetting Chinese

The task: translate the demo corpus's Chinese sentences into English. Prompt "Chinese: 小明累了。\\nEnglish:",
response " Xiaoming is tired.", the loss on the response only. Three fine-tunings, the same steps and learning
rate (half a minute to a minute each on two cores):

- `sft`: the task's loss alone;
- `mix`: the task's loss + λ × the pretraining loss (λ = 1, a batch of Chinese each step);
- `kl`: the task's loss + β × KL(p_base ‖ p) (β = 1, on the same Chinese: the new model's next-character
  distribution held near the base model's).
"""),
    code("""
settings = dict(steps=1000, warmup=50, batch_size=16, pretrain_batch_size=8, lr=2e-3, min_lr=2e-4,
                eval_every=1000, eval_iters=5, eval_pairs=50, threads=2)
cures = {"sft": {}, "mix": {"mix": 1.0}, "kl": {"kl": 1.0}}
for name, cure in cures.items():
    run = RUNS / f"gpt-{name}"
    if not Run(run).exists:   # not trained, or stopped part way
        t0 = time.perf_counter()
        recipe = FinetuneRecipe(FinetuneData(str(BASE), "demo:train", "demo:valid"), FinetuneConfig(**settings, **cure))
        resume = Run(run).has_checkpoint
        finetune(recipe, run, resume=resume, overwrite=not resume, quiet=True, plot=False)
        print(f"{name}: {time.perf_counter() - t0:.0f} s")
"""),
    md("""
## 5. 量一量：任务学会了多少，中文忘了多少

`score` 和 `qkv experiment forgetting` 用的是同一个函数：测试集上贪心解码的完全正确率和 BLEU（这些句子的组合
训练时都没见过），以及中文验证集上的损失（预训练的损失）。遗忘 = 微调后的中文损失 − 微调前的。
""", """
## 5. Measured: how much of the task was learned, how much Chinese was forgotten

`score` is the function `qkv experiment forgetting` uses: exact match and BLEU of greedy completions on the
test split (combinations never seen in training), and the loss on the Chinese validation text (the pretraining
loss). Forgetting = the Chinese loss after fine-tuning − before.
"""),
    code("""
base = score(BASE, BASE)
results = {name: score(RUNS / f"gpt-{name}", BASE) for name in cures}
print(f"{'':5} {'exact':>6} {'BLEU':>6} {'Chinese loss':>13} {'forgot':>7}")
print(f"{'base':5} {base['exact_match']:6.1f} {base['bleu']:6.1f} {base['pretrain_loss']:13.3f} {0:7.3f}")
forgot = {}
for name, r in results.items():
    forgot[name] = r["pretrain_loss"] - base["pretrain_loss"]
    print(f"{name:5} {r['exact_match']:6.1f} {r['bleu']:6.1f} {r['pretrain_loss']:13.3f} {forgot[name]:7.3f}")
assert all(r["exact_match"] > 50 for r in results.values())          # every one learned the task
assert forgot["sft"] > 1.0                                            # plain fine-tuning forgot Chinese
assert forgot["mix"] < 0.2 * forgot["sft"] and forgot["kl"] < 0.2 * forgot["sft"]   # the cures kept it
"""),
    md("""
## 6. 忘掉是什么样子

同一个中文开头，让三个模型接着写（每次选最可能的字）。预训练的模型写出一句像样的中文；只做了任务的模型，
中文已经写不好了；两种办法训练出的模型，还记得。
""", """
## 6. What forgetting looks like

The same Chinese beginning, continued by each model (the most likely character every time). The pretrained
model writes a proper sentence; the one fine-tuned on the task alone no longer can; those trained with either
cure still do.
"""),
    code("""
for name in ("base", *cures):
    run = BASE if name == "base" else RUNS / f"gpt-{name}"
    text = Completer.from_run(run, device="cpu").complete("小明今天", max_new_tokens=12, temperature=0, stop=["\\n"])
    print(f"{name:5} 小明今天{text}")
"""),
]

NOTEBOOKS = {"01_who_is_he": WHO_IS_HE, "02_gpt_forgetting": GPT_FORGETTING}


def build(cells: list[tuple[str, str, str]], lang: str) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                   "language_info": {"name": "python"}}
    # The language the views speak, set once at the top.
    nb.cells.append(nbformat.v4.new_code_cell(f'LANG = "{lang}"'))
    for kind, zh, en in cells:
        text = zh if lang == "zh" else en
        nb.cells.append(nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: a rebuild changes nothing that did not change
    return nb


def written() -> dict[Path, str]:
    """Every notebook file and its text, as this file writes them."""
    return {HERE / lang / f"{name}.ipynb": nbformat.writes(build(cells, lang)) + "\n"
            for name, cells in NOTEBOOKS.items() for lang in LANGS}


def execute(path: Path, cwd: Path) -> nbformat.NotebookNode:
    """The notebook at ``path`` run from top to bottom in ``cwd`` (nbclient, the python3 kernel)."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def fingerprint(path: Path) -> str:
    """What a rendering records of the notebook it was made from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


_STYLE = """body{font-family:system-ui,"qkv CJK",sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.6}
pre{font-family:ui-monospace,"DejaVu Sans Mono","qkv CJK",monospace;background:#f6f6f4;padding:.6em;overflow-x:auto}.jp-InputPrompt,.jp-OutputPrompt{display:none}
.jp-CodeCell{margin:1em 0}.jp-OutputArea-output pre{background:none;border-left:3px solid #ddd}"""


def _text_of(nb: nbformat.NotebookNode) -> str:
    """The text a rendering shows outside its views: cells and their printed outputs."""
    parts = []
    for cell in nb.cells:
        parts.append(cell.source)
        for out in cell.get("outputs", []):
            parts.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def render_html(nb: nbformat.NotebookNode, source: Path) -> str:
    """An executed notebook as one self-contained page (nbconvert's basic template: no script or stylesheet
    is fetched), its Chinese in the glyphs of the CJK font qkv brings (a machine without a CJK font shows
    boxes otherwise), marked with the fingerprint of its notebook file."""
    import base64

    from nbconvert import HTMLExporter

    from qkv.interpret.fonts import css_unicode_range, woff2_subset

    body, _ = HTMLExporter(template_name="basic").from_notebook_node(nb)
    title = next((c.source.splitlines()[0].lstrip("# ") for c in nb.cells if c.cell_type == "markdown"), source.stem)
    font = woff2_subset(_text_of(nb))
    face = "" if font is None else (
        '@font-face{font-family:"qkv CJK";src:url(data:font/woff2;base64,'
        f'{base64.b64encode(font).decode("ascii")}) format("woff2");unicode-range:{css_unicode_range()}}}')
    return (f"<!doctype html>\n<!-- qkv notebook {source.parent.name}/{source.name} sha256 {fingerprint(source)} -->\n"
            f'<html><head><meta charset="utf-8"><title>{html.escape(title)}</title><style>{face}{_STYLE}</style>'
            f"</head><body>\n{body}\n</body></html>\n")


def main(argv: list[str]) -> int:
    for path, text in written().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path.relative_to(HERE.parent))
    if "--html" in argv:
        with tempfile.TemporaryDirectory() as cwd:  # one folder for all: the first trains the demo, the rest load it
            for path in written():
                out = HTML_DIR / path.parent.name / f"{path.stem}.html"
                out.parent.mkdir(parents=True, exist_ok=True)
                start = time.perf_counter()
                nb = execute(path, Path(cwd))
                seconds = time.perf_counter() - start
                out.write_text(render_html(nb, path), encoding="utf-8")
                print(f"{out.relative_to(HERE.parent)}  ({path.parent.name}/{path.name} ran in {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
