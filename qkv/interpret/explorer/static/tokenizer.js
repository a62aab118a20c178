/*
 * tokenizer.js: the run's tokenizer in the page, so that a typed sentence becomes the ids the model
 * reads without Python. It reads the description `qkv export onnx` writes into manifest.json
 * (qkv/interop/onnx.py: page_tokenizer) and encodes as the run's own tokenizer does, which
 * tests/explorer/test_live_page.py checks id for id on the demo's test sentences and on odd input:
 *
 * - "char": one id per character (code point), unknown ones <unk> (or refused, without specials);
 * - "bpe": qkv's joint BPE (qkv/tokenizers/bpe.py on the tokenizers library): its special tokens kept
 *   whole, NFC, the lexicon's words split off (Split, isolated), spaces as U+2581 starting a new piece
 *   (Metaspace, never prepended), punctuation on its own (Punctuation, isolated), then the merges
 *   applied lowest rank first, each character outside the vocabulary one <unk>.
 *
 * A tokenizer the page cannot follow (GPT-2's byte-level BPE) is refused by the export, not here.
 */
(function () {
  "use strict";

  var META = "\u2581";
  // The tokenizers library's is_punc: ASCII punctuation, or Unicode's P* categories.
  var PUNCT = /^(?:[!-\/:-@\[-`{-~]|\p{P})$/u;

  function escapeRegex(s) { return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"); }

  // Pieces of `text` cut at the matches of `re` (global), the matches pieces of their own.
  function isolate(text, re) {
    var out = [], last = 0, m;
    re.lastIndex = 0;
    while ((m = re.exec(text)) !== null) {
      if (m[0].length === 0) { re.lastIndex += 1; continue; }
      if (m.index > last) out.push({ text: text.slice(last, m.index), match: false });
      out.push({ text: m[0], match: true });
      last = m.index + m[0].length;
    }
    if (last < text.length) out.push({ text: text.slice(last), match: false });
    return out;
  }

  function Tokenizer(desc) {
    this.type = desc.type;
    this.tokens = desc.tokens;
    this.pad = desc.pad; this.bos = desc.bos; this.eos = desc.eos; this.unk = desc.unk;
    this.ids = new Map();
    for (var i = 0; i < desc.tokens.length; i++) this.ids.set(desc.tokens[i], i);
    this.drop = new Set([desc.pad, desc.bos, desc.eos].filter(function (x) { return x !== null && x !== undefined; }));
    if (desc.type === "bpe") {
      this.ranks = new Map();
      for (var r = 0; r < desc.merges.length; r++) this.ranks.set(desc.merges[r][0] + " " + desc.merges[r][1], r);
      this.words = desc.words ? new RegExp(desc.words, "gu") : null;
      var specials = desc.specials.slice().sort(function (a, b) { return b.length - a.length; });
      this.specials = specials.length ? new RegExp(specials.map(escapeRegex).join("|"), "g") : null;
    } else if (desc.type !== "char") {
      throw new Error("tokenizer.js: unknown tokenizer type " + desc.type);
    }
  }

  // The characters of `text` the vocabulary lacks, each once, in order (the page names them to the reader).
  Tokenizer.prototype.unknown = function (text) {
    var seen = new Set(), out = [], self = this;
    var s = this.type === "bpe" ? text.normalize("NFC").replace(/ /g, META) : text;
    Array.from(s).forEach(function (c) {
      if (!self.ids.has(c) && !seen.has(c)) { seen.add(c); out.push(c); }
    });
    return out;
  };

  Tokenizer.prototype.encode = function (text) {
    return this.type === "char" ? this.encodeChars(text) : this.encodeBpe(text);
  };

  Tokenizer.prototype.encodeChars = function (text) {
    var self = this;
    return Array.from(text).map(function (c) {
      var id = self.ids.get(c);
      if (id !== undefined) return id;
      if (self.unk === null || self.unk === undefined) {
        var err = new Error("character not in the vocabulary: " + c);
        err.qkvUnknown = c;
        throw err;
      }
      return self.unk;
    });
  };

  Tokenizer.prototype.encodeBpe = function (text) {
    var self = this, ids = [];
    var parts = this.specials ? isolate(text, this.specials) : [{ text: text, match: false }];
    parts.forEach(function (part) {
      if (part.match) { ids.push(self.ids.get(part.text)); return; }
      self.pieces(part.text.normalize("NFC")).forEach(function (piece) { self.bpe(piece, ids); });
    });
    return ids;
  };

  // The pre-tokenizers in their order: Split (the lexicon), Metaspace, Punctuation.
  Tokenizer.prototype.pieces = function (text) {
    var first = this.words ? isolate(text, this.words).map(function (p) { return p.text; }) : [text];
    var out = [];
    first.forEach(function (p) {
      // Metaspace, split=True: a space becomes U+2581 and starts a new piece.
      var s = p.replace(/ /g, META), start = 0;
      var metas = [];
      for (var i = 1; i < s.length; i++) if (s[i] === META) { metas.push(s.slice(start, i)); start = i; }
      metas.push(s.slice(start));
      metas.forEach(function (m) {
        if (!m) return;
        var buf = "";
        Array.from(m).forEach(function (c) {
          if (PUNCT.test(c)) { if (buf) out.push(buf); out.push(c); buf = ""; } else buf += c;
        });
        if (buf) out.push(buf);
      });
    });
    return out;
  };

  // BPE on one piece: its characters, then the best-ranked adjacent pair merged until none is left.
  Tokenizer.prototype.bpe = function (piece, ids) {
    var self = this;
    var symbols = Array.from(piece);
    for (;;) {
      var best = -1, bestRank = Infinity;
      for (var i = 0; i + 1 < symbols.length; i++) {
        var r = self.ranks.get(symbols[i] + " " + symbols[i + 1]);
        if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
      }
      if (best < 0) break;
      symbols.splice(best, 2, symbols[best] + symbols[best + 1]);
    }
    symbols.forEach(function (s) {
      var id = self.ids.get(s);
      ids.push(id !== undefined ? id : self.unk);
    });
  };

  // The text of `ids`, <pad> <bos> <eos> dropped and <unk> visible, as the run's decode gives it.
  Tokenizer.prototype.decode = function (ids) {
    var self = this, out = "";
    ids.forEach(function (i) {
      if (self.drop.has(i)) return;
      out += self.type === "bpe" ? self.tokens[i].split(META).join(" ") : self.tokens[i];
    });
    return out;
  };

  // A token as the figures label it (qkv.interpret.model_maps.token_strings).
  Tokenizer.prototype.label = function (i) {
    var t = this.tokens[i].split(META).join(" ").split("\u0120").join(" ").split("\u010a").join("\\n");
    var s = t.trim();
    return s || (t ? "\u2423" : "\u2205");
  };

  globalThis.QKVTokenizer = { Tokenizer: Tokenizer };
})();
