"""Experiments: grids of variants of one recipe, trained and scored alike (:mod:`qkv.experiments.grid`),
and the paper's own, Table 3 (:mod:`qkv.experiments.table3`)."""
