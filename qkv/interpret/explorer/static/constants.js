/*
 * constants.js: the numbers of the explorer's figures, written once. figures.js and explorer.js read
 * them from globalThis.QKVConstants; qkv/interpret/explorer/constants.py reads this file as JSON (the
 * text from the first opening brace to the last closing one), for the Python reference figures.py and
 * for the payload checks. So the object below is strict JSON: double quotes, no comments inside.
 *
 * TOKENS: The sentence of every figure: 小明累了，他想睡觉 ("Xiaoming is tired, he wants to sleep").
 * QUERY_TOKEN: 他 (he): the token whose query figure 1 drags; it should find 小明.
 * FIG1_KEYS: Figure 1 (Section 3.2.1): one query against five 2-D keys, placed so that 他's query points at
 *   小明.
 * FIG1_QUERY: 他's query, the default arrow (86% on 小明); it can be dragged up to FIG1_MAX_QUERY_NORM.
 * FIG2_DEFAULT_SEED: Figure 2 (Section 3.2.1, footnote 4): why divide by sqrt(d_k). At d_k 64 and this
 *   seed: 99.97% on one key unscaled, at most 42% scaled.
 * FIG3_EMBEDDINGS: Figure 3 (Equation 1): tiny embeddings (5 x d_model 4) and projections (4 x d_k 3) in
 *   halves, so that a dot product can be followed by hand; W_Q != W_K makes the table asymmetric. W_V (4 x
 *   2) serves figure 5's word-order experiment.
 * FIG4_ONE_HEAD_VALUES: Figure 4 (Section 3.2.2): one head or two. v(小明) and v(累了), for one head and for
 *   each of two heads in its own 2-D subspace; default splits of attention.
 * FIG5_D_MODEL: Figure 5 (Section 3.5): positions as clocks (8 sin/cos pairs), up to FIG5_MAX_POS; the
 *   word-order experiment uses figure 3's width.
 * KINDS: Figure 6: the kinds of attention map, in the order the page shows them, and their labels.
 */
globalThis.QKVConstants = {
  "TOKENS": ["小明", "累了", "他", "想", "睡觉"],
  "QUERY_TOKEN": 2,
  "FIG1_KEYS": [
    [1.5, 0.9],
    [0.3, -1.6],
    [0.8, 0.1],
    [-1.2, 0.6],
    [-0.8, -1.2]
  ],
  "FIG1_VALUES": [
    [1.5, 1.2],
    [1.4, -1.0],
    [0.2, 0.4],
    [-1.3, 0.8],
    [-0.9, -1.3]
  ],
  "FIG1_QUERY": [2.4, 1.4],
  "FIG1_MAX_QUERY_NORM": 3.5,
  "FIG2_DEFAULT_SEED": 10,
  "FIG2_N_KEYS": 8,
  "FIG2_DK_CHOICES": [2, 4, 8, 16, 32, 64, 128, 256, 512],
  "FIG2_DEFAULT_DK": 64,
  "FIG3_EMBEDDINGS": [
    [-1.0, -0.5, 1.0, 0.0],
    [1.0, 0.0, -0.5, 1.0],
    [0.5, 1.0, 0.5, 0.5],
    [0.0, -1.0, -1.0, 1.0],
    [1.0, 0.0, 0.0, -1.0]
  ],
  "FIG3_W_Q": [
    [0.0, 0.0, -1.0],
    [0.0, 0.0, -0.5],
    [0.5, 0.5, 0.0],
    [0.5, -1.0, -1.0]
  ],
  "FIG3_W_K": [
    [1.0, -0.5, 1.0],
    [0.5, -1.0, 0.5],
    [0.0, -0.5, -1.0],
    [-0.5, 0.0, 0.5]
  ],
  "FIG3_W_V": [
    [1.0, 0.0],
    [0.0, 1.0],
    [0.5, -0.5],
    [-0.5, 0.5]
  ],
  "FIG4_ONE_HEAD_VALUES": [
    [1.6, 1.1],
    [-1.2, -0.9]
  ],
  "FIG4_HEAD_VALUES": [
    [
      [1.5, 1.2],
      [-0.4, -1.3]
    ],
    [
      [-1.3, 0.9],
      [1.4, -0.8]
    ]
  ],
  "FIG4_DEFAULT_SPLIT": 0.5,
  "FIG4_DEFAULT_HEAD_SPLITS": [0.95, 0.05],
  "FIG5_D_MODEL": 16,
  "FIG5_MAX_POS": 100,
  "FIG5_WORD_ORDER_D_MODEL": 4,
  "KINDS": ["encoder_self", "decoder_self", "cross", "self"],
  "KIND_LABELS": {
    "encoder_self": "encoder self",
    "decoder_self": "decoder self",
    "cross": "cross",
    "self": "self"
  }
};
