/*
 * table3.js: qkv's rows (A) and (E) of Table 3 beside the paper's, for the explorer's multi-head figure.
 * Written by qkv.experiments.table3.write_explorer_table('docs/results/table3'); strict JSON below.
 */
globalThis.QKVTable3 = {
 "rows": [
  {
   "row": "base",
   "label": "base",
   "seeds": 3,
   "bleu": 25.3007,
   "bleu_sd": 0.4982,
   "bleu_delta": null,
   "bleu_delta_sd": null,
   "paired": null,
   "paper_row": "base",
   "paper_bleu": 25.8,
   "paper_delta": 0.0
  },
  {
   "row": "A",
   "label": "h=1",
   "seeds": 3,
   "bleu": 23.9005,
   "bleu_sd": 0.3487,
   "bleu_delta": -1.4002,
   "bleu_delta_sd": 0.4223,
   "paired": 3,
   "paper_row": "A h=1",
   "paper_bleu": 24.9,
   "paper_delta": -0.9
  },
  {
   "row": "A",
   "label": "h=2",
   "seeds": 3,
   "bleu": 25.0165,
   "bleu_sd": 0.712,
   "bleu_delta": -0.2843,
   "bleu_delta_sd": 0.9982,
   "paired": 3,
   "paper_row": "A h=4",
   "paper_bleu": 25.5,
   "paper_delta": -0.3
  },
  {
   "row": "A",
   "label": "h=8",
   "seeds": 3,
   "bleu": 25.3087,
   "bleu_sd": 0.3605,
   "bleu_delta": 0.008,
   "bleu_delta_sd": 0.6762,
   "paired": 3,
   "paper_row": "A h=16",
   "paper_bleu": 25.8,
   "paper_delta": 0.0
  },
  {
   "row": "A",
   "label": "h=16",
   "seeds": 3,
   "bleu": 23.9056,
   "bleu_sd": 0.0487,
   "bleu_delta": -1.3951,
   "bleu_delta_sd": 0.5239,
   "paired": 3,
   "paper_row": "A h=32",
   "paper_bleu": 25.4,
   "paper_delta": -0.4
  },
  {
   "row": "E",
   "label": "learned",
   "seeds": 3,
   "bleu": 22.354,
   "bleu_sd": 1.2231,
   "bleu_delta": -2.9467,
   "bleu_delta_sd": 1.434,
   "paired": 3,
   "paper_row": "E learned",
   "paper_bleu": 25.7,
   "paper_delta": -0.1
  }
 ],
 "steps": "430"
};
