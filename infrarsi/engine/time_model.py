"""Global time model: Bayesian linear regression of log step time on knob settings.

log t = intercept + sum(main effects of the config's settings) + sum(selected pair effects)
+ noise. Main effects take their prior mean and sd from ``Priors`` (log scale, relative to
the baseline, exactly the coefficient's meaning). Interactions enter only when the data
can identify them and the evidence asks for them (see ``_select_pairs``), with zero-mean,
tighter priors: most knob pairs act independently on log time, and an unsupported
interaction column would only soak up noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from infrarsi.core.priors import Priors
from infrarsi.engine.encoding import PRIOR_SCALE_STD, Encoding, pair_columns

# A wide, essentially flat prior on the intercept (log seconds of the baseline).
_INTERCEPT_STD = 10.0
# Effects of a numeric knob's levels share a slope in log2 of the value (``Encoding.
# prior_covariance``): 0.15 per doubling at one sd. On the generated development jobs
# (seeds 0-2) it raised the mean fraction of the oracle at 20 trials from 0.909 to 0.927;
# 0.3 did no better than 0.15.
SLOPE_STD = 0.15
# Step-time noise before data: ~5% CV is what repeated baseline runs typically show;
# worth two pseudo-observations so a handful of trials dominate it.
_NOISE_PRIOR_STD, _NOISE_PRIOR_DOF = 0.05, 2.0
_NOISE_FLOOR_STD = 1e-3


@dataclass
class TimeModel:
    encoding: Encoding
    priors: Priors
    # Interactions: ±25% at one sd; a pair needs >= min_support joint observations (and
    # each setting seen without the other) before it is a candidate, and a Bayes factor
    # of >= 3 ("positive evidence", Kass & Raftery 1995) to be added.
    interaction_std: float = math.log(1.25)
    min_support: int = 2
    log_bayes_factor_threshold: float = math.log(3.0)
    max_interactions: int = 16
    # A pair of settings no ok trial has held together may still interact: each such pair
    # a config holds adds this (log sd, +-5%) to its predictive variance, so that a
    # combination the data never saw is not predicted as surely as its parts.
    unseen_pair_std: float = math.log(1.05)
    pairs: list[tuple[int, int]] = field(default_factory=list)
    _unseen: np.ndarray | None = field(default=None, repr=False)
    noise_std: float = _NOISE_PRIOR_STD
    num_observations: int = 0

    def __post_init__(self) -> None:
        enc = self.encoding
        labels = [enc.label(j) for j in range(enc.num_settings)]
        self.main_prior_mean = np.array([self.priors.get(*lb).log_time_mean for lb in labels])
        self.main_prior_std = np.array([self.priors.get(*lb).log_time_std for lb in labels])
        self._set_posterior_to_prior()

    def _prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Prior mean and covariance of (intercept, main effects, selected pairs)."""
        num_pairs = len(self.pairs)
        mean = np.concatenate([[0.0], self.main_prior_mean, np.zeros(num_pairs)])
        var = np.concatenate([[_INTERCEPT_STD**2], np.zeros(self.encoding.num_settings),
                              np.full(num_pairs, self.interaction_std**2)])
        cov = np.diag(var)
        main = slice(1, 1 + self.encoding.num_settings)
        cov[main, main] = self.encoding.prior_covariance(self.main_prior_mean, self.main_prior_std, PRIOR_SCALE_STD,
                                                        SLOPE_STD)
        return mean, cov

    def _set_posterior_to_prior(self) -> None:
        self.coef_mean, self.coef_cov = self._prior()

    def design(self, main: np.ndarray) -> np.ndarray:
        return np.hstack([np.ones((main.shape[0], 1)), main, pair_columns(main, self.pairs)])

    def fit(self, index_matrix: np.ndarray, log_times: np.ndarray) -> "TimeModel":
        """Refit from scratch on every ok trial (cheap: a few dozen coefficients)."""
        y = np.asarray(log_times, dtype=float)
        main = self.encoding.main(index_matrix)
        self.num_observations = len(y)
        self._unseen = (main.T @ main == 0).astype(float)
        np.fill_diagonal(self._unseen, 0.0)
        self.pairs = []
        if len(y) == 0:
            self.noise_std = _NOISE_PRIOR_STD
            self._set_posterior_to_prior()
            return self
        self._fit_noise_and_posterior(main, y)
        self.pairs = self._select_pairs(main, y)
        if self.pairs:
            self._fit_noise_and_posterior(main, y)
        return self

    def _posterior(self, design: np.ndarray, y: np.ndarray) -> None:
        m0, c0 = self._prior()
        p0 = np.linalg.inv(c0)
        precision = design.T @ design / self.noise_std**2 + p0
        self.coef_cov = np.linalg.inv(precision)
        self.coef_cov = 0.5 * (self.coef_cov + self.coef_cov.T)
        self.coef_mean = self.coef_cov @ (design.T @ y / self.noise_std**2 + p0 @ m0)

    def _fit_noise_and_posterior(self, main: np.ndarray, y: np.ndarray) -> None:
        # Alternate posterior and a conjugate-style noise update (RSS plus the posterior
        # spread of the fit, plus pseudo-observations); three rounds converge in practice.
        design = self.design(main)
        for _ in range(3):
            self._posterior(design, y)
            resid = y - design @ self.coef_mean
            spread = float(((design @ self.coef_cov) * design).sum())
            ss = _NOISE_PRIOR_DOF * _NOISE_PRIOR_STD**2 + resid @ resid + spread
            self.noise_std = max(math.sqrt(ss / (_NOISE_PRIOR_DOF + len(y))), _NOISE_FLOOR_STD)
        self._posterior(design, y)

    def candidate_pairs(self, main: np.ndarray) -> list[tuple[int, int]]:
        """Setting pairs of different knobs that the data can tell apart from main effects."""
        knob_of = [k for k, _ in self.encoding.settings]
        both = main.T @ main
        only = main.T @ (1.0 - main)
        out = []
        for a in range(main.shape[1]):
            for b in range(a + 1, main.shape[1]):
                if knob_of[a] != knob_of[b] and both[a, b] >= self.min_support \
                        and only[a, b] >= 1 and only[b, a] >= 1:
                    out.append((a, b))
        return out

    def _select_pairs(self, main: np.ndarray, y: np.ndarray) -> list[tuple[int, int]]:
        """Greedy forward selection by Bayes factor of the marginal likelihood.

        Adding a column z with prior N(0, s^2) to y ~ N(Dm, C) gives, by the matrix
        determinant and Sherman-Morrison lemmas, log BF = -log(1+s^2 a)/2 + s^2 b^2/(2(1+s^2 a))
        with a = z'C^-1 z and b = z'C^-1 r: every candidate is scored in one product.
        """
        candidates = self.candidate_pairs(main)
        if not candidates:
            return []
        m0, c0 = self._prior()  # pairs is empty here: intercept + main effects
        design = self.design(main)
        cov = self.noise_std**2 * np.eye(len(y)) + design @ c0 @ design.T
        resid = y - design @ m0
        z_all = pair_columns(main, candidates)
        s2 = self.interaction_std**2
        chosen: list[int] = []
        while len(chosen) < self.max_interactions:
            cinv_z = np.linalg.solve(cov, z_all)
            a = np.einsum("ij,ij->j", z_all, cinv_z)
            b = cinv_z.T @ resid
            log_bf = -0.5 * np.log1p(s2 * a) + 0.5 * s2 * b**2 / (1.0 + s2 * a)
            log_bf[chosen] = -np.inf
            best = int(np.argmax(log_bf))
            if log_bf[best] < self.log_bayes_factor_threshold:
                break
            chosen.append(best)
            cov = cov + s2 * np.outer(z_all[:, best], z_all[:, best])
        return [candidates[i] for i in sorted(chosen)]

    def predict_main(self, main: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of the expected log step time (noise excluded)."""
        design = self.design(main)
        mean = design @ self.coef_mean
        var = ((design @ self.coef_cov) * design).sum(axis=1)
        if self._unseen is not None:
            # Settings of one knob never co-occur, so only pairs of different knobs count.
            var = var + 0.5 * ((main @ self._unseen) * main).sum(axis=1) * self.unseen_pair_std**2
        return mean, np.sqrt(np.maximum(var, 1e-12))

    def predict(self, index_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.predict_main(self.encoding.main(index_matrix))

    def predict_difference(self, index_a: np.ndarray, index_b: np.ndarray) -> tuple[float, float]:
        """Posterior mean and sd of log t(a) - log t(b), one config each: what config a costs
        over config b, with the correlation of their shared coefficients taken into account
        (two configs that differ in one setting are predicted far more surely apart than
        either is alone). Pairs of settings no ok trial held together add their variance
        where they belong to one config and not the other."""
        main_a, main_b = self.encoding.main(index_a[None]), self.encoding.main(index_b[None])
        diff = (self.design(main_a) - self.design(main_b))[0]
        var = float(diff @ self.coef_cov @ diff)
        if self._unseen is not None:
            shared = main_a * main_b
            var += (self._unseen_pairs(main_a - shared, shared) + self._unseen_pairs(main_b - shared, shared)) \
                * self.unseen_pair_std ** 2
        return float(diff @ self.coef_mean), math.sqrt(max(var, 1e-12))

    def _unseen_pairs(self, own: np.ndarray, shared: np.ndarray) -> float:
        """Unseen setting pairs a config holds that another does not: those among its own
        settings (``own``) and those between its own and the ``shared`` ones."""
        return float(0.5 * (own @ self._unseen @ own.T)[0, 0] + (own @ self._unseen @ shared.T)[0, 0])

    def lack_of_fit_var(self, measurement_std: float) -> float:
        """What the model's residual holds beyond a run's own noise (``measurement_std``,
        log scale): the variance of a config's true log time about the model's fit, the
        part of each config's time that no main effect or selected pair explains."""
        return max(self.noise_std**2 - measurement_std**2, 0.0)

    def main_effects(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of each setting's main effect (log time vs baseline)."""
        idx = slice(1, 1 + self.encoding.num_settings)
        return self.coef_mean[idx].copy(), np.sqrt(np.diag(self.coef_cov)[idx])

    def interactions(self) -> list[dict]:
        """The selected pair effects, labelled, for the report."""
        base = 1 + self.encoding.num_settings
        sd = np.sqrt(np.diag(self.coef_cov))
        return [{"settings": [list(self.encoding.label(a)), list(self.encoding.label(b))],
                 "log_time_effect": float(self.coef_mean[base + i]), "sd": float(sd[base + i])}
                for i, (a, b) in enumerate(self.pairs)]


def with_measurements(predicted: float, predicted_var: float, measured: float, measured_var: float
                      ) -> tuple[float, float]:
    """A config's log time (or two configs' difference) from the model's prediction and
    the config's own runs, each weighed by its precision: ``predicted_var`` is the model's
    variance plus its lack of fit (``TimeModel.lack_of_fit_var``), ``measured_var`` the
    runs' noise over their count. On a quiet machine the runs decide; on a noisy one, or
    where the model fits its runs to within their noise, the model does. The model was fitted
    on those runs too, so they count in both terms, the more so where a config's settings
    are rare in the history; a fit without them changed which configs were chosen but not
    the mean outcome on simulated campaigns (docs/measured.md, History), so none is made."""
    w_pred, w_meas = 1.0 / max(predicted_var, 1e-12), 1.0 / max(measured_var, 1e-12)
    mean = (w_pred * predicted + w_meas * measured) / (w_pred + w_meas)
    return mean, math.sqrt(1.0 / (w_pred + w_meas))
