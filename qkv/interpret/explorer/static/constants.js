/*
 * constants.js: the numbers of the explorer's figures, written once. figures.js and explorer.js read
 * them from globalThis.QKVConstants; qkv/interpret/explorer/constants.py reads this file as JSON (the
 * text from the first opening brace to the last closing one), for the Python reference
 * (tests/interpret/figures_reference.py) and for the payload checks. So the object below is strict JSON: double quotes, no comments inside.
 *
 * TOKENS: The sentence of every figure: 小明累了，他想睡觉 ("Xiaoming is tired, he wants to sleep").
 * QUERY_TOKEN: 他 (he): the token whose query figure 1 drags; it should find 小明.
 * TOY_EMBEDDINGS, TOY_W_Q, TOY_W_K, TOY_W_V: one toy world for figures 1, 3, 4 and the word-order
 *   experiment: 5 embeddings x of d_model 4 and three 4 x 2 projections (d_k = 2, as in the first
 *   article's first figure), in halves and tenths so that a product can be followed by hand. Figure
 *   1's keys and values are the rows of XW^K and XW^V and its starting query is x(他)W^Q; figure 3's
 *   table is softmax((XW^Q)(XW^K)^T / sqrt(2)), so its row 3 is figure 1's 他: 57.0% on 小明, the
 *   article's number, with 他's own value (-0.05, -0.2) near the origin. The numbers come from a search
 *   over such matrices for those properties; W^Q != W^K makes the table asymmetric.
 * TOY_W_V2: figure 4's second head: its own value projection, so the same two tokens have other
 *   values there (head 1's are figure 1's).
 * FIG1_MAX_QUERY_NORM: the dragged query stays within this length (the plot spans +-4).
 * FIG2_*: figure 2 (Section 3.2.1, footnote 4): why divide by sqrt(d_k). One fixed draw of a query
 *   and 5 keys of FIG2_MAX_DK components each (mulberry32 seed FIG2_DEFAULT_SEED, the query first);
 *   a d_k on the slider uses the first d_k components of the same vectors. The seed was chosen so
 *   that at d_k 64 the unscaled softmax gives 99.1% to one key and the scaled one 39%, 22%, 16%, ...
 *   (the article's numbers), and the unscaled maximum never falls as d_k grows. FIG2_KEY_TOKENS
 *   names each key by a token of the sentence.
 * FIG4_DEFAULT_*: figure 4 (Section 3.2.2): default splits of attention between 小明 and 累了.
 * FIG5_*: figure 5 (Section 3.5): positions as clocks (8 sin/cos pairs), up to FIG5_MAX_POS.
 * PAPER: the base model's sizes (Section 3, Table 3), which the stack and multi-head figures show.
 * COST_*: the table's cost: up to COST_MAX_TOKENS tokens, 4 bytes (fp32) a score.
 * PRACTICE_TEXT: the second article's practice sentence for GPT (its section 5).
 * SEED_TEXT: the first article's sentence, which a translator's live figures start on.
 * KINDS: the kinds of attention map of the model figure, in the order the page shows them.
 */
globalThis.QKVConstants = {
  "TOKENS": ["小明", "累了", "他", "想", "睡觉"],
  "QUERY_TOKEN": 2,
  "TOY_EMBEDDINGS": [
    [1.0, 0.0, 0.0, -1.5],
    [-0.5, 0.0, -1.5, -0.5],
    [-0.3, 1.0, 0.0, -0.4],
    [-1.0, -0.5, -1.0, 1.0],
    [0.5, 0.0, 0.0, 0.0]
  ],
  "TOY_W_Q": [
    [0.0, 0.5],
    [-1.0, -1.0],
    [-0.5, 0.5],
    [0.5, 0.0]
  ],
  "TOY_W_K": [
    [0.0, 0.5],
    [-0.5, 0.5],
    [-0.5, 0.5],
    [1.0, 1.0]
  ],
  "TOY_W_V": [
    [-0.5, -1.0],
    [0.0, -0.5],
    [1.0, 0.0],
    [0.5, 0.0]
  ],
  "TOY_W_V2": [
    [0.5, 1.0],
    [0.0, 0.0],
    [-1.0, 0.5],
    [1.0, 0.0]
  ],
  "FIG1_MAX_QUERY_NORM": 3.5,
  "FIG2_DEFAULT_SEED": 2415855,
  "FIG2_N_KEYS": 5,
  "FIG2_KEY_TOKENS": [2, 4, 3, 1, 0],
  "FIG2_MAX_DK": 512,
  "FIG2_DK_CHOICES": [2, 4, 8, 16, 32, 64, 128, 256, 512],
  "FIG2_DEFAULT_DK": 64,
  "FIG4_DEFAULT_SPLIT": 0.5,
  "FIG4_DEFAULT_HEAD_SPLITS": [0.95, 0.05],
  "FIG5_D_MODEL": 16,
  "FIG5_MAX_POS": 100,
  "PAPER": {"d_model": 512, "n_heads": 8, "d_k": 64, "d_ff": 2048, "n_layers": 6},
  "COST_MAX_TOKENS": 1000,
  "COST_DEFAULT_TOKENS": 10,
  "COST_BYTES_PER_SCORE": 4,
  "PRACTICE_TEXT": "今天天气很好",
  "SEED_TEXT": "小明累了，他想睡觉。",
  "KINDS": ["encoder_self", "decoder_self", "cross", "self"]
};
