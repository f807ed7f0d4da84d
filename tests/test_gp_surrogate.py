"""The GP surrogate behind ``default`` and ``gp``: the alignment features and the per-feature relevance."""

from __future__ import annotations

import numpy as np

from evotune.core.space import Context, SearchSpace, categorical, ordinal
from evotune.search.strategies import make_strategy
from evotune.search.surrogate import encode


def space() -> SearchSpace:
    return SearchSpace("toy", [ordinal("block", [16, 32, 48, 64, 96, 128]), ordinal("unroll", [1, 2, 4, 8]),
                               categorical("raster", ["m", "n"]), ordinal("fixed", [7])])


def test_integer_sizes_carry_alignment_features():
    sp = space()
    fs = sp.feasible(Context())
    enc = encode(sp, fs)
    # block: position, power of two, 2-adic valuation; unroll: position only (all powers of two,
    # so alignment adds nothing); raster: one-hot; a single-choice parameter: nothing
    assert [len(cols) for cols in enc.features] == [1, 1, 1, 1, 2]
    row = fs.row({"block": 48, "unroll": 2, "raster": "n", "fixed": 7})
    block_pos, pow2, adic, unroll, *raster = enc.x[row]
    assert (block_pos, pow2, unroll) == (2 / 5, 0.0, 1 / 3)
    assert adic == (4 - 4) / (6 - 4)  # 48 = 16 * 3: as aligned as 16; 64 and 128 cap at 6
    assert np.allclose(raster, [0, 1 / np.sqrt(2)])
    assert enc.x.min() >= 0 and enc.x.max() <= 1


def test_relevance_drops_a_parameter_that_does_not_matter():
    """Time depends on block only: the fitted length-scales ignore raster and weigh block most."""
    sp = space()
    fs = sp.feasible(Context())
    s = make_strategy("default", sp, fs, seed=0, refit=1)
    times = {b: t for b, t in zip([16, 32, 48, 64, 96, 128], [4.0, 2.0, 5.0, 1.0, 6.0, 1.5], strict=True)}
    s.tell([(fs.point(r), times[fs.point(r)["block"]]) for r in range(len(fs))])
    fit = s.model.fit()
    block = np.concatenate(s.model.encoding.features[:3])
    raster = s.model.encoding.features[4]
    assert np.all(fit.scale[raster] == 0.0), fit.scale
    assert fit.scale[block].max() > fit.scale[s.model.encoding.features[3]].max()
    # and the model predicts the measured order of blocks
    mu, _ = s.model.predict(fit, np.arange(len(fs)))
    by_block = {b: mu[[r for r in range(len(fs)) if fs.point(r)["block"] == b]].mean() for b in times}
    assert sorted(by_block, key=by_block.get) == sorted(times, key=times.get)
