/*
 * figures.js: the numbers behind figures 1-5, with the same formulas as the Python reference
 * tests/interpret/figures_reference.py (the tests compare the two within 1e-6) and the constants of
 * constants.js, which both read.
 * Pure functions only: no DOM. Exposed as globalThis.QKVFigures.
 */
(function () {
  "use strict";

  // The constants, written once in constants.js (which Python reads too).
  var C = globalThis.QKVConstants;
  var TOKENS = C.TOKENS;
  var QUERY_TOKEN = C.QUERY_TOKEN;
  var TOY_EMBEDDINGS = C.TOY_EMBEDDINGS;
  var TOY_W_Q = C.TOY_W_Q;
  var TOY_W_K = C.TOY_W_K;
  var TOY_W_V = C.TOY_W_V;
  var FIG1_MAX_QUERY_NORM = C.FIG1_MAX_QUERY_NORM;
  var FIG2_DEFAULT_SEED = C.FIG2_DEFAULT_SEED;
  var FIG2_N_KEYS = C.FIG2_N_KEYS;
  var FIG2_KEY_TOKENS = C.FIG2_KEY_TOKENS;
  var FIG2_MAX_DK = C.FIG2_MAX_DK;
  var FIG2_DK_CHOICES = C.FIG2_DK_CHOICES;
  var FIG2_DEFAULT_DK = C.FIG2_DEFAULT_DK;
  var FIG4_DEFAULT_SPLIT = C.FIG4_DEFAULT_SPLIT;
  var FIG4_DEFAULT_HEAD_SPLITS = C.FIG4_DEFAULT_HEAD_SPLITS;
  var FIG5_D_MODEL = C.FIG5_D_MODEL;
  var FIG5_MAX_POS = C.FIG5_MAX_POS;

  // ------------------------------------------------------------------ small linear algebra
  function dot(a, b) {
    var s = 0;
    for (var i = 0; i < a.length; i++) s += a[i] * b[i];
    return s;
  }

  function matmul(a, b) { // (n, m) x (m, p) -> (n, p)
    return a.map(function (row) {
      var out = [];
      for (var j = 0; j < b[0].length; j++) {
        var s = 0;
        for (var k = 0; k < row.length; k++) s += row[k] * b[k][j];
        out.push(s);
      }
      return out;
    });
  }

  function softmax(scores) {
    var m = Math.max.apply(null, scores);
    var e = scores.map(function (s) { return Math.exp(s - m); });
    var z = e.reduce(function (a, b) { return a + b; }, 0);
    return e.map(function (x) { return x / z; });
  }

  function weightedSum(weights, vectors) {
    var out = vectors[0].map(function () { return 0; });
    for (var i = 0; i < weights.length; i++) {
      for (var c = 0; c < out.length; c++) out[c] += weights[i] * vectors[i][c];
    }
    return out;
  }

  // Percentages that add up to exactly 100 (largest remainder), as figures.round_percents.
  function roundPercents(weights, decimals) {
    if (decimals === undefined) decimals = 1;
    var unit = Math.pow(10, decimals);
    var scaled = weights.map(function (w) { return w * 100 * unit; });
    var floors = scaled.map(Math.floor);
    var left = 100 * unit - floors.reduce(function (a, b) { return a + b; }, 0);
    var order = scaled.map(function (_, i) { return i; });
    order.sort(function (i, j) {
      var d = (scaled[j] - floors[j]) - (scaled[i] - floors[i]);
      return d !== 0 ? d : i - j;
    });
    for (var r = 0; r < Math.max(0, left); r++) floors[order[r]] += 1;
    return floors.map(function (f) { return f / unit; });
  }

  // ------------------------------------------------------------------ seeded randomness
  function mulberry32(seed) {
    var a = seed >>> 0;
    return function () {
      a = (a + 0x6D2B79F5) >>> 0;
      var t = Math.imul(a ^ (a >>> 15), 1 | a);
      t = ((t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t) >>> 0;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  function gaussians(seed, n) {
    var rand = mulberry32(seed);
    var out = [];
    for (var i = 0; i < n; i++) {
      var u1 = 1 - rand(); // in (0, 1]
      var u2 = rand();
      out.push(Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * u2));
    }
    return out;
  }

  // ------------------------------------------------------------------ the toy world
  // Figures 1, 3 and 4 share these: keys and values are rows of XW^K and XW^V, 他's query is
  // x(他)W^Q, so figure 3's row 3 is figure 1's 他 (as figures_reference.py).
  var FIG1_KEYS = matmul(TOY_EMBEDDINGS, TOY_W_K);     // (5, 2)
  var FIG1_VALUES = matmul(TOY_EMBEDDINGS, TOY_W_V);   // (5, 2)
  var FIG1_QUERY = matmul([TOY_EMBEDDINGS[QUERY_TOKEN]], TOY_W_Q)[0]; // (2,)
  var FIG4_ONE_HEAD_VALUES = FIG1_VALUES.slice(0, 2);  // 小明, 累了
  var FIG4_HEAD_VALUES = [FIG1_VALUES.slice(0, 2), matmul(TOY_EMBEDDINGS, C.TOY_W_V2).slice(0, 2)];
  var FIG5_WORD_ORDER_D_MODEL = TOY_EMBEDDINGS[0].length;

  // ------------------------------------------------------------------ figure 1
  function attend(query, keys, values) {
    var scale = Math.sqrt(query.length);
    var scores = keys.map(function (k) { return dot(query, k) / scale; });
    var weights = softmax(scores);
    return { scores: scores, weights: weights, output: weightedSum(weights, values) };
  }

  function figure1(query) {
    return attend(query || FIG1_QUERY, FIG1_KEYS, FIG1_VALUES);
  }

  function clampNorm(vec, maxNorm) {
    if (maxNorm === undefined) maxNorm = FIG1_MAX_QUERY_NORM;
    var n = Math.hypot(vec[0], vec[1]);
    return n > maxNorm ? [vec[0] * maxNorm / n, vec[1] * maxNorm / n] : [vec[0], vec[1]];
  }

  function convexHull(points) {
    var pts = points.map(function (p) { return [p[0], p[1]]; });
    pts.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
    if (pts.length <= 2) return pts;
    function cross(o, a, b) {
      return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]);
    }
    var lower = [];
    pts.forEach(function (p) {
      while (lower.length >= 2 && cross(lower[lower.length - 2], lower[lower.length - 1], p) <= 0) lower.pop();
      lower.push(p);
    });
    var upper = [];
    pts.slice().reverse().forEach(function (p) {
      while (upper.length >= 2 && cross(upper[upper.length - 2], upper[upper.length - 1], p) <= 0) upper.pop();
      upper.push(p);
    });
    return lower.slice(0, -1).concat(upper.slice(0, -1));
  }

  function inConvexHull(point, hull, tol) {
    if (tol === undefined) tol = 1e-9;
    for (var i = 0; i < hull.length; i++) {
      var a = hull[i], b = hull[(i + 1) % hull.length];
      if ((b[0] - a[0]) * (point[1] - a[1]) - (b[1] - a[1]) * (point[0] - a[0]) < -tol) return false;
    }
    return true;
  }

  // ------------------------------------------------------------------ figure 2
  // One draw of FIG2_MAX_DK components per vector (the query first); d_k takes the first d_k of
  // each, so a larger d_k adds dimensions to the same vectors (as figures.random_qk).
  function randomQK(seed, dK, nKeys) {
    if (nKeys === undefined) nKeys = FIG2_N_KEYS;
    var z = gaussians(seed, FIG2_MAX_DK * (nKeys + 1));
    var q = z.slice(0, dK);
    var keys = [];
    for (var i = 0; i < nKeys; i++) keys.push(z.slice(FIG2_MAX_DK * (i + 1), FIG2_MAX_DK * (i + 1) + dK));
    return { q: q, keys: keys };
  }

  function figure2(seed, dK) {
    if (seed === undefined) seed = FIG2_DEFAULT_SEED;
    if (dK === undefined) dK = FIG2_DEFAULT_DK;
    var r = randomQK(seed, dK);
    var dots = r.keys.map(function (k) { return dot(r.q, k); });
    var unscaled = softmax(dots);
    var scale = Math.sqrt(dK);
    var scaled = softmax(dots.map(function (d) { return d / scale; }));
    var mean = dots.reduce(function (a, b) { return a + b; }, 0) / dots.length;
    var variance = dots.reduce(function (a, d) { return a + (d - mean) * (d - mean); }, 0) / dots.length;
    return {
      dots: dots,
      unscaled: unscaled,
      scaled: scaled,
      max_unscaled: Math.max.apply(null, unscaled),
      max_scaled: Math.max.apply(null, scaled),
      dot_std: Math.sqrt(variance),
      expected_std: Math.sqrt(dK)
    };
  }

  // ------------------------------------------------------------------ figure 3
  function figure3() {
    var Q = matmul(TOY_EMBEDDINGS, TOY_W_Q);
    var K = matmul(TOY_EMBEDDINGS, TOY_W_K);
    var scale = Math.sqrt(Q[0].length);
    var scores = Q.map(function (q) { return K.map(function (k) { return dot(q, k) / scale; }); });
    return { Q: Q, K: K, scores: scores, weights: scores.map(softmax) };
  }

  function dotProductTerms(i, j) {
    var fig = figure3();
    var q = fig.Q[i], k = fig.K[j];
    var products = q.map(function (x, c) { return x * k[c]; });
    var d = products.reduce(function (a, b) { return a + b; }, 0);
    return { q: q, k: k, products: products, dot: d, score: d / Math.sqrt(q.length) };
  }

  // ------------------------------------------------------------------ figure 4
  function oneHeadOutput(split, values) {
    if (values === undefined) values = FIG4_ONE_HEAD_VALUES;
    return [
      split * values[0][0] + (1 - split) * values[1][0],
      split * values[0][1] + (1 - split) * values[1][1]
    ];
  }

  function twoHeadOutput(split1, split2, headValues) {
    if (headValues === undefined) headValues = FIG4_HEAD_VALUES;
    var heads = [oneHeadOutput(split1, headValues[0]), oneHeadOutput(split2, headValues[1])];
    return { heads: heads, concat: heads[0].concat(heads[1]) };
  }

  // ------------------------------------------------------------------ figure 5
  function clockFrequencies(dModel) {
    if (dModel === undefined) dModel = FIG5_D_MODEL;
    var out = [];
    for (var i = 0; i < dModel / 2; i++) out.push(1 / Math.pow(10000, 2 * i / dModel));
    return out;
  }

  // Positions per whole turn of each hand: 2 pi * 10000^(2i/d) (6.3 ... ~19,869 at d_model 16).
  function stepsPerTurn(dModel) {
    return clockFrequencies(dModel).map(function (w) { return 2 * Math.PI / w; });
  }

  function sinusoidalPE(pos, dModel) {
    if (dModel === undefined) dModel = FIG5_D_MODEL;
    var pe = [];
    clockFrequencies(dModel).forEach(function (w) {
      pe.push(Math.sin(pos * w));
      pe.push(Math.cos(pos * w));
    });
    return pe;
  }

  function mod2pi(x) {
    var t = 2 * Math.PI;
    var r = x % t;
    return r < 0 ? r + t : r;
  }

  function clockAngles(pos, dModel) {
    var pe = sinusoidalPE(pos, dModel);
    var out = [];
    for (var i = 0; i < pe.length; i += 2) out.push(mod2pi(Math.atan2(pe[i], pe[i + 1])));
    return out;
  }

  function shiftAngles(k, dModel) {
    return clockFrequencies(dModel).map(function (w) { return mod2pi(k * w); });
  }

  function selfAttention(x) {
    var Q = matmul(x, TOY_W_Q), K = matmul(x, TOY_W_K), V = matmul(x, TOY_W_V);
    var scale = Math.sqrt(Q[0].length);
    return Q.map(function (q) {
      var w = softmax(K.map(function (k) { return dot(q, k) / scale; }));
      return weightedSum(w, V);
    });
  }

  function wordOrderOutputs(order, usePE) {
    var x = order.map(function (t, pos) {
      var e = TOY_EMBEDDINGS[t].slice();
      if (usePE) {
        var pe = sinusoidalPE(pos, FIG5_WORD_ORDER_D_MODEL);
        e = e.map(function (v, c) { return v + pe[c]; });
      }
      return e;
    });
    return selfAttention(x);
  }

  function swapped(order, i, j) {
    var out = order.slice();
    var t = out[i]; out[i] = out[j]; out[j] = t;
    return out;
  }

  function wordOrderChange(i, j, usePE) {
    var order = TOKENS.map(function (_, k) { return k; });
    var afterOrder = swapped(order, i, j);
    var before = wordOrderOutputs(order, usePE);
    var after = wordOrderOutputs(afterOrder, usePE);
    var worst = 0;
    after.forEach(function (row, p) {
      row.forEach(function (v, c) { worst = Math.max(worst, Math.abs(v - before[afterOrder[p]][c])); });
    });
    return worst;
  }

  // ------------------------------------------------------------------ the table's cost
  function tableCost(n, heads) {
    var scores = n * n * (heads || 1);
    return { scores: scores, bytes: scores * C.COST_BYTES_PER_SCORE };
  }

  globalThis.QKVFigures = {
    TOKENS: TOKENS, QUERY_TOKEN: QUERY_TOKEN,
    TOY_EMBEDDINGS: TOY_EMBEDDINGS, TOY_W_Q: TOY_W_Q, TOY_W_K: TOY_W_K, TOY_W_V: TOY_W_V,
    FIG1_KEYS: FIG1_KEYS, FIG1_VALUES: FIG1_VALUES, FIG1_QUERY: FIG1_QUERY,
    FIG1_MAX_QUERY_NORM: FIG1_MAX_QUERY_NORM,
    FIG2_DEFAULT_SEED: FIG2_DEFAULT_SEED, FIG2_N_KEYS: FIG2_N_KEYS, FIG2_KEY_TOKENS: FIG2_KEY_TOKENS,
    FIG2_DK_CHOICES: FIG2_DK_CHOICES, FIG2_DEFAULT_DK: FIG2_DEFAULT_DK,
    FIG4_ONE_HEAD_VALUES: FIG4_ONE_HEAD_VALUES, FIG4_HEAD_VALUES: FIG4_HEAD_VALUES,
    FIG4_DEFAULT_SPLIT: FIG4_DEFAULT_SPLIT, FIG4_DEFAULT_HEAD_SPLITS: FIG4_DEFAULT_HEAD_SPLITS,
    FIG5_D_MODEL: FIG5_D_MODEL, FIG5_MAX_POS: FIG5_MAX_POS,
    FIG5_WORD_ORDER_D_MODEL: FIG5_WORD_ORDER_D_MODEL,
    dot: dot, matmul: matmul, softmax: softmax, roundPercents: roundPercents,
    mulberry32: mulberry32, gaussians: gaussians,
    attend: attend, figure1: figure1, clampNorm: clampNorm,
    convexHull: convexHull, inConvexHull: inConvexHull,
    randomQK: randomQK, figure2: figure2,
    figure3: figure3, dotProductTerms: dotProductTerms,
    oneHeadOutput: oneHeadOutput, twoHeadOutput: twoHeadOutput,
    clockFrequencies: clockFrequencies, stepsPerTurn: stepsPerTurn, sinusoidalPE: sinusoidalPE,
    clockAngles: clockAngles, shiftAngles: shiftAngles,
    selfAttention: selfAttention, wordOrderOutputs: wordOrderOutputs,
    swapped: swapped, wordOrderChange: wordOrderChange, tableCost: tableCost
  };
})();
