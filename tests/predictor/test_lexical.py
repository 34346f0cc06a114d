"""The lexical half of the predictor: TF-IDF as scikit-learn computes it, ridge = its closed form, LOO penalty."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.feature_extraction.text import TfidfVectorizer

from asp.predictor.lexical import (
    NGRAM_OFFSET,
    _counts,
    _tfidf,
    fit_lexical,
    ngram_ids,
    ridge_loo,
)

DOCS = [[1, 5, 7, 2], [1, 5, 9, 9, 2], [1, 8, 7, 2], [1, 5, 7, 7, 2], [1, 3, 2], [1, 8, 9, 2]]


def test_ngram_ids() -> None:
    f = ngram_ids([1, 5, 7])
    assert f[:3].tolist() == [1, 5, 7] and f.size == 5 and np.all(f[3:] >= NGRAM_OFFSET)
    assert ngram_ids([1, 5, 7])[3] == ngram_ids([5, 5, 1, 5])[6]  # the same pair (1, 5) hashes alike anywhere
    assert ngram_ids([1, 5])[2] != ngram_ids([5, 1])[2]  # order matters
    with pytest.raises(ValueError, match="token ids"):
        ngram_ids([NGRAM_OFFSET])


def test_tfidf_matches_scikit_learn() -> None:
    # scikit-learn's TfidfVectorizer on the same features (as strings), sublinear tf, smooth idf, l2 rows, min_df 2
    vec = TfidfVectorizer(analyzer=lambda d: [str(i) for i in ngram_ids(d)], sublinear_tf=True, min_df=2)
    expected = vec.fit_transform(DOCS).toarray()
    counts = _counts(DOCS)
    ids, df = np.unique(np.concatenate([i for i, _ in counts]), return_counts=True)
    features = ids[df >= 2]
    idf = np.log((1 + len(DOCS)) / (1 + df[df >= 2])) + 1
    ours = _tfidf(counts, features, idf).toarray()
    order = [int(np.flatnonzero(features == int(name))[0]) for name in vec.get_feature_names_out()]
    np.testing.assert_allclose(ours[:, order], expected, atol=1e-12)


def test_ridge_is_the_closed_form_and_loo_is_exact() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 30)), rng.normal(size=12)
    alpha, dual = ridge_loo(x @ x.T, y, [0.5])
    primal = np.linalg.solve(x.T @ x + 0.5 * np.eye(30), x.T @ y)  # the textbook ridge solution
    np.testing.assert_allclose(x.T @ dual, primal, atol=1e-9)

    # leave-one-out by refitting 12 times picks the same penalty as the shortcut
    def loo(a: float) -> float:
        errs = []
        for i in range(12):
            keep = np.arange(12) != i
            w = np.linalg.solve(x[keep].T @ x[keep] + a * np.eye(30), x[keep].T @ y[keep])
            errs.append((x[i] @ w - y[i]) ** 2)
        return float(np.mean(errs))

    alphas = [0.01, 0.3, 3.0, 30.0]
    assert ridge_loo(x @ x.T, y, alphas)[0] == min(alphas, key=loo)


def test_fit_lexical_learns_which_tokens_mean_long() -> None:
    rng = np.random.default_rng(1)
    docs = [[101, int(w), *rng.integers(200, 260, size=5).tolist(), 102] for w in rng.integers(10, 12, size=80)]
    y = np.array([np.log1p(300.0) if d[1] == 11 else np.log1p(20.0) for d in docs]) + rng.normal(0, 0.1, size=80)
    model = fit_lexical(docs[:60], y[:60])
    pred = model.predict(docs[60:])
    long = np.array([d[1] == 11 for d in docs[60:]])
    assert pred[long].min() > pred[~long].max()  # token 11 ("write an essay") means long answers
    assert model.intercept == pytest.approx(y[:60].mean()) and model.alpha > 0
    again = type(model).from_arrays(model.to_arrays())
    np.testing.assert_array_equal(again.predict(docs[60:]), pred)
    assert model.predict([[101, 999_999, 102]])[0] == pytest.approx(model.intercept, abs=0.5)  # unseen tokens
    with pytest.raises(ValueError, match="one target each"):
        fit_lexical(docs[:3], y[:2])
