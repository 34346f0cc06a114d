"""The lexical half of the length predictor: TF-IDF of token unigrams and bigrams + ridge regression (pure numpy).

Which words a prompt uses ("write a story", "list", "in one word") says much about how long its answer is, and a
linear model of them ranks real prompts almost as well as the fine-tuned encoder while erring differently:
averaging the two (``LengthPredictor`` with ``lexical_weight`` > 0) ranks better than either
(benchmarks/predictor_real.py). The features are computed from the backbone tokenizer's ids, so any code that feeds
the predictor token ids (train, evaluate, predict, re-profile) gets them with no text in hand.

Features: every token id (unigram) and every pair of neighbouring ids (bigram, hashed into ``BIGRAM_BUCKETS``), with
sublinear term frequency 1 + log(count), smoothed inverse document frequency log((1 + n) / (1 + df)) + 1 over the
training prompts (features seen in fewer than ``MIN_DF`` prompts are dropped), rows scaled to unit length, as
scikit-learn's ``TfidfVectorizer(sublinear_tf=True)``. Ridge regression on log(1 + length) in its dual form (n
training prompts, many more features), its penalty chosen from ``RIDGE_ALPHAS`` by exact leave-one-out error.

Run the tests with ``.venv/bin/python -m pytest tests/predictor/test_lexical.py -q``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

NGRAM_OFFSET = 1 << 20  # unigram features are the token ids themselves (< this); bigrams come after
BIGRAM_BUCKETS = 1 << 20
RIDGE_ALPHAS: tuple[float, ...] = tuple(float(a) for a in np.logspace(-2, 2, 9))
MIN_DF = 2


def ngram_ids(ids: Sequence[int]) -> np.ndarray:
    """Feature ids [len + len - 1] of one prompt: its token ids and its hashed neighbouring pairs.

    Args:
        ids: the prompt's token ids (special tokens included: [CLS] + first word is a feature too).

    Returns:
        int64 array; unigrams are < ``NGRAM_OFFSET``, bigrams in [NGRAM_OFFSET, NGRAM_OFFSET + BIGRAM_BUCKETS).
    """
    a = np.asarray(ids, dtype=np.int64)
    if a.size and (a.min() < 0 or a.max() >= NGRAM_OFFSET):
        raise ValueError(f"token ids must lie in [0, {NGRAM_OFFSET}); got {a.min()}..{a.max()}")
    bigrams = NGRAM_OFFSET + ((a[:-1] * 1_000_003) ^ a[1:]) % BIGRAM_BUCKETS
    return np.concatenate([a, bigrams])


def _counts(docs: Sequence[Sequence[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
    return [np.unique(ngram_ids(d), return_counts=True) for d in docs]


def _tfidf(counts: list[tuple[np.ndarray, np.ndarray]], features: np.ndarray, idf: np.ndarray) -> sparse.csr_matrix:
    """Unit-length TF-IDF rows [n, len(features)] over the kept ``features`` (sorted) of each prompt's counts."""
    rows, cols, vals = [], [], []
    for r, (ids, cnt) in enumerate(counts):
        pos = np.searchsorted(features, ids)
        known = (pos < features.size) & (features[np.minimum(pos, features.size - 1)] == ids)
        w = (1.0 + np.log(cnt[known])) * idf[pos[known]]
        norm = float(np.sqrt(np.sum(w * w)))
        if norm > 0:
            rows.append(np.full(w.size, r))
            cols.append(pos[known])
            vals.append(w / norm)
    if not rows:
        return sparse.csr_matrix((len(counts), features.size))
    return sparse.csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(len(counts), features.size)
    )


def ridge_loo(gram: np.ndarray, y: np.ndarray, alphas: Sequence[float]) -> tuple[float, np.ndarray]:
    """Dual ridge regression with the penalty of least leave-one-out squared error.

    With K = Q diag(lam) Q^T, the hat matrix is H = Q diag(lam / (lam + a)) Q^T and the leave-one-out residual of
    prompt i is (y - H y)_i / (1 - H_ii) (exact for ridge).

    Args:
        gram: [n, n] K = X X^T of the training rows.
        y: [n] centred targets.
        alphas: candidate penalties (> 0).

    Returns:
        (alpha, dual coefficients [n]); the primal weights are X^T dual.
    """
    lam, q = np.linalg.eigh(gram)
    lam = np.maximum(lam, 0.0)
    qy = q.T @ y
    best: tuple[float, float] | None = None
    for a in alphas:
        shrink = lam / (lam + a)
        resid = y - q @ (shrink * qy)
        h = np.einsum("ij,j,ij->i", q, shrink, q)
        loo = float(np.mean((resid / np.maximum(1.0 - h, 1e-12)) ** 2))
        if best is None or loo < best[1]:
            best = (float(a), loo)
    assert best is not None
    alpha = best[0]
    return alpha, q @ (qy / (lam + alpha))


@dataclass(frozen=True)
class LexicalModel:
    """A fitted TF-IDF ridge: kept feature ids (sorted), their idf and weights, the intercept and the penalty."""

    features: np.ndarray  # int64 [m]
    idf: np.ndarray  # float64 [m]
    coef: np.ndarray  # float64 [m]
    intercept: float
    alpha: float

    def predict(self, docs: Sequence[Sequence[int]]) -> np.ndarray:
        """Predicted log(1 + length) [n] of prompts given as token-id lists."""
        if not len(docs):
            return np.zeros(0)
        return self.intercept + _tfidf(_counts(docs), self.features, self.idf) @ self.coef

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays to save (``from_arrays`` reads them back)."""
        return {
            "features": self.features.astype(np.int64),
            "idf": self.idf.astype(np.float64),
            "coef": self.coef.astype(np.float64),
            "intercept": np.array([self.intercept]),
            "alpha": np.array([self.alpha]),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> LexicalModel:
        return cls(
            features=np.asarray(arrays["features"], dtype=np.int64),
            idf=np.asarray(arrays["idf"], dtype=np.float64),
            coef=np.asarray(arrays["coef"], dtype=np.float64),
            intercept=float(np.asarray(arrays["intercept"]).reshape(-1)[0]),
            alpha=float(np.asarray(arrays["alpha"]).reshape(-1)[0]),
        )


def fit_lexical(
    docs: Sequence[Sequence[int]], y: np.ndarray, alphas: Sequence[float] = RIDGE_ALPHAS, min_df: int = MIN_DF
) -> LexicalModel:
    """Fit the TF-IDF ridge on training prompts (token-id lists) and their log(1 + length) targets.

    Args:
        docs: [n] token-id lists (as the predictor sees them: truncated to its max_length).
        y: [n] targets (log1p of the mean length).
        alphas: ridge penalties tried (leave-one-out error picks one).
        min_df: features in fewer training prompts than this are dropped.

    Returns:
        The fitted ``LexicalModel``.

    Raises:
        ValueError: fewer than 2 prompts, or ``y`` of another length.
    """
    y = np.asarray(y, dtype=np.float64)
    if len(docs) < 2 or y.shape != (len(docs),):
        raise ValueError(f"need >= 2 prompts and one target each; got {len(docs)} prompts, {y.size} targets")
    counts = _counts(docs)
    all_ids, df = np.unique(np.concatenate([ids for ids, _ in counts]), return_counts=True)
    keep = df >= min_df
    features = all_ids[keep]
    idf = np.log((1.0 + len(docs)) / (1.0 + df[keep])) + 1.0
    x = _tfidf(counts, features, idf)
    intercept = float(y.mean())
    alpha, dual = ridge_loo((x @ x.T).toarray(), y - intercept, alphas)
    coef = np.asarray(x.T @ dual).reshape(-1)
    return LexicalModel(features=features, idf=idf, coef=coef, intercept=intercept, alpha=alpha)
