"""Censored memory model: peak memory as a sum of parts, OOMs as censored data.

log peak = log sum over parts c of exp(a_c + sum of the config's settings' log factors on
part c) + noise: a_c is the log size of part c at the baseline, and a setting scales each
part by its own factor (``memory_components``: a micro-batch of 4 scales the activations,
not the optimizer states), or, where the part table does not know it, the whole peak.
With one part this is the log-additive model (intercept plus one effect per setting).
ZeRO's sharding, which depends on the stage and the data-parallel degree together, is a
fixed feature of the states with a coefficient near 1.

An ok trial with a measured peak is an exact observation; an OOM says only ``peak >=
capacity`` (right-censored); an ok trial without a measured peak says ``peak < capacity``
(left-censored). Fitted by MAP (a Tobit likelihood plus the priors as Gaussian penalties);
a Laplace approximation at the MAP, linearised in the parameters, gives each config's
probability of fitting. Each setting's price is its effect on the baseline's peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special

from infrarsi.core.priors import Priors
from infrarsi.engine.encoding import PRIOR_SCALE_STD, Encoding
from infrarsi.engine.memory_components import SHARDING_COEF_STD, SHARE_LOG_STD, MemoryComponents

EXACT, AT_LEAST, BELOW = 0, 1, 2  # observation kinds for ``fit``
# Peak memory of one config repeats within a few percent; the prior lets data overrule.
_NOISE_LOG_STD_PRIOR = (math.log(0.05), 1.0)
# The noise term is measurement noise *plus* the error of the model's form itself. With
# fewer trials than settings the MAP interpolates and would drive it to the repeatability
# of one config (~0.5%), claiming a precision the form cannot have. The floor, 5%, is the
# low end of the held-out errors measured for the earlier log-additive form (leave-one-out
# refits on simulated campaigns gave 1-25%); the held-out check below widens the predictive sd where the data
# show more.
_NOISE_STD_BOUNDS = (0.05, 1.0)
# With one part, the intercept (log bytes of the baseline's peak) is only weakly tied to
# its centre.
_INTERCEPT_STD = 3.0
# Weight (in pseudo-observations) of "the model is calibrated" in the held-out check.
_CALIBRATION_PRIOR_OBS = 2.0
# Predictions are made in chunks of this many configs (the Jacobian is configs x parameters).
_CHUNK = 8192


def _log_mills(u: np.ndarray) -> np.ndarray:
    """log(phi(u) / Phi(u)), stable for very negative u."""
    return -0.5 * u**2 - 0.5 * math.log(2 * math.pi) - special.log_ndtr(u)


@dataclass
class MemoryModel:
    encoding: Encoding
    priors: Priors
    capacity_bytes: int | None = None
    # The parts and their prior; None: one part, the priors' whole-peak effects.
    components: MemoryComponents | None = None
    coef_mean: np.ndarray = field(init=False)
    coef_cov: np.ndarray = field(init=False)
    noise_std: float = field(init=False, default=math.exp(_NOISE_LOG_STD_PRIOR[0]))
    # Multiplies the predictive sd so that held-out peaks fall where it says (see below).
    calibration: float = field(init=False, default=1.0)
    num_observations: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.components is None:
            self.components = MemoryComponents.single(self.encoding, self.priors)
        comp = self.components
        self.num_parts = len(comp.parts)
        self._part_cols = np.flatnonzero(~comp.whole)   # settings with a factor per part
        self._whole_cols = np.flatnonzero(comp.whole)   # settings that scale the whole peak
        # Parameters: part intercepts, part factors (part-major), whole-peak factors, sharding.
        self._slices = {"a": slice(0, self.num_parts)}
        at = self.num_parts
        self._slices["part"] = slice(at, at + self.num_parts * len(self._part_cols))
        at = self._slices["part"].stop
        self._slices["whole"] = slice(at, at + len(self._whole_cols))
        at = self._slices["whole"].stop
        self._slices["sharding"] = slice(at, at + len(comp.sharding))
        self.num_params = self._slices["sharding"].stop
        self._set_prior(math.log(self.capacity_bytes / 2) if self.capacity_bytes else 0.0)
        self._cache: tuple | None = None

    # ---- prior -----------------------------------------------------------------------
    def _set_prior(self, centre: float) -> None:
        comp, enc = self.components, self.encoding
        mean = np.zeros(self.num_params)
        cov = np.zeros((self.num_params, self.num_params))
        sa = self._slices["a"]
        mean[sa] = centre + comp.log_share
        cov[sa, sa] = np.eye(self.num_parts) * (SHARE_LOG_STD if self.num_parts > 1 else _INTERCEPT_STD) ** 2
        part = self._slices["part"].start
        for c in range(self.num_parts):
            block = enc.prior_covariance(comp.effect_mean[c], comp.effect_std[c], PRIOR_SCALE_STD)
            idx = slice(part + c * len(self._part_cols), part + (c + 1) * len(self._part_cols))
            mean[idx] = comp.effect_mean[c, self._part_cols]
            cov[idx, idx] = block[np.ix_(self._part_cols, self._part_cols)]
        sw = self._slices["whole"]
        block = enc.prior_covariance(comp.effect_mean[0], comp.effect_std[0], PRIOR_SCALE_STD)
        mean[sw] = comp.effect_mean[0, self._whole_cols]
        cov[sw, sw] = block[np.ix_(self._whole_cols, self._whole_cols)]
        ss = self._slices["sharding"]
        mean[ss] = 1.0
        cov[ss, ss] = np.eye(len(comp.sharding)) * SHARDING_COEF_STD**2
        self.prior_mean, self.prior_cov = mean, cov
        self.prior_precision = np.linalg.inv(cov)
        self.coef_mean, self.coef_cov = mean.copy(), cov.copy()

    # ---- the form --------------------------------------------------------------------
    def _sharding_features(self, main: np.ndarray) -> np.ndarray:
        if not self.components.sharding:
            return np.zeros((len(main), 0))
        enc = self.encoding
        idx = np.tile(np.array(enc.baseline_indices), (len(main), 1))
        for j, (k, v) in enumerate(enc.settings):
            idx[:, k] = np.where(main[:, j] > 0, v, idx[:, k])
        cols = enc.space.columns(idx)
        return np.stack([s.feature(cols) for s in self.components.sharding], axis=1)

    def _mean_and_jacobian(self, theta: np.ndarray, main: np.ndarray,
                           shard: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """log peak of each row and its derivative in the parameters."""
        num_parts, part_cols = self.num_parts, self._part_cols
        factors = theta[self._slices["part"]].reshape(num_parts, len(part_cols))
        terms = theta[self._slices["a"]][None, :] + main[:, part_cols] @ factors.T
        shard_coef = theta[self._slices["sharding"]]
        for s, spec in enumerate(self.components.sharding):
            terms[:, spec.part] += shard_coef[s] * shard[:, s]
        whole = main[:, self._whole_cols] @ theta[self._slices["whole"]]
        log_parts = special.logsumexp(terms, axis=1)
        weight = np.exp(terms - log_parts[:, None])  # each part's share of the row's peak
        jac = np.zeros((len(main), self.num_params))
        jac[:, self._slices["a"]] = weight
        jac[:, self._slices["part"]] = (weight[:, :, None] * main[:, None, part_cols]).reshape(len(main), -1)
        jac[:, self._slices["whole"]] = main[:, self._whole_cols]
        for s, spec in enumerate(self.components.sharding):
            jac[:, self._slices["sharding"].start + s] = weight[:, spec.part] * shard[:, s]
        return log_parts + whole, jac

    # ---- fitting ---------------------------------------------------------------------
    def fit(self, index_matrix: np.ndarray, kinds: np.ndarray, log_bytes: np.ndarray) -> "MemoryModel":
        """MAP fit on every trial that says something about memory (see the kinds)."""
        kinds, y = np.asarray(kinds, dtype=int), np.asarray(log_bytes, dtype=float)
        self.num_observations = len(y)
        self._cache = None
        if len(y) == 0:
            return self
        main = self.encoding.main(index_matrix)
        exact = kinds == EXACT
        at_baseline = exact & (main.sum(axis=1) == 0)
        if at_baseline.any():
            self._set_prior(float(np.median(y[at_baseline])))
        elif exact.any():
            self._set_prior(float(np.median(y[exact])))
        elif not self.capacity_bytes:
            self._set_prior(float(np.median(y)))
        shard = self._sharding_features(main)
        theta0 = np.concatenate([self.prior_mean, [_NOISE_LOG_STD_PRIOR[0]]])
        bounds = [(None, None)] * self.num_params + [tuple(math.log(b) for b in _NOISE_STD_BOUNDS)]
        res = optimize.minimize(self._objective, theta0, args=(main, shard, kinds, y), jac=True,
                                method="L-BFGS-B", bounds=bounds)
        self.coef_mean, self.noise_std = res.x[:-1], float(math.exp(res.x[-1]))
        mu, jac = self._mean_and_jacobian(self.coef_mean, main, shard)
        self.coef_cov = self._laplace_cov(mu, jac, kinds, y)
        self.calibration = self._held_out_calibration(mu[exact], jac[exact], y[exact])
        return self

    def _held_out_calibration(self, mu: np.ndarray, jac: np.ndarray, y: np.ndarray) -> float:
        """RMS of the leave-one-out standardised errors of the measured peaks (>= 1).

        Peak memory is only approximated by the model's form, and with fewer trials than
        settings the MAP interpolates the data: the fitted noise falls to its floor and the
        posterior claims percent-level precision it does not have (a config predicted to fit
        with P = 1.00 then OOMs). Leave-one-out exposes that: under the Laplace posterior,
        removing exact point i gives the standardised held-out error z_i = r_i / sqrt(noise^2
        - v_i), with r_i its residual and v_i its posterior variance (Sherman-Morrison). The
        predictive sd is scaled by sqrt(mean z^2), shrunk towards 1 by a pseudo-observation prior.
        """
        if len(y) == 0:
            return 1.0
        noise_var = self.noise_std**2
        v = ((jac @ self.coef_cov) * jac).sum(axis=1)
        z2 = (y - mu) ** 2 / np.maximum(noise_var - v, 1e-6 * noise_var)
        scale2 = (_CALIBRATION_PRIOR_OBS + z2.sum()) / (_CALIBRATION_PRIOR_OBS + len(y))
        return float(math.sqrt(max(scale2, 1.0)))

    def _objective(self, theta: np.ndarray, main: np.ndarray, shard: np.ndarray, kinds: np.ndarray,
                   y: np.ndarray) -> tuple[float, np.ndarray]:
        """Negative log posterior and its gradient in (parameters, log sd)."""
        coef, log_sd = theta[:-1], theta[-1]
        sd = math.exp(log_sd)
        mu, jac = self._mean_and_jacobian(coef, main, shard)
        nll, d_mu, d_logsd = 0.0, np.zeros_like(mu), 0.0
        ex = kinds == EXACT
        r = (y[ex] - mu[ex]) / sd
        nll += 0.5 * r @ r + ex.sum() * log_sd
        d_mu[ex] = -r / sd
        d_logsd += float(ex.sum() - r @ r)
        cens = ~ex
        sign = np.where(kinds[cens] == AT_LEAST, 1.0, -1.0)
        u = sign * (mu[cens] - y[cens]) / sd
        nll -= special.log_ndtr(u).sum()
        lam = np.exp(_log_mills(u))
        d_mu[cens] = -lam * sign / sd
        d_logsd += float(lam @ u)
        pen = self.prior_precision @ (coef - self.prior_mean)
        m, s = _NOISE_LOG_STD_PRIOR
        nll += 0.5 * (coef - self.prior_mean) @ pen + 0.5 * ((log_sd - m) / s) ** 2
        grad = np.concatenate([jac.T @ d_mu + pen, [d_logsd + (log_sd - m) / s**2]])
        return float(nll), grad

    def _laplace_cov(self, mu: np.ndarray, jac: np.ndarray, kinds: np.ndarray, y: np.ndarray) -> np.ndarray:
        # Curvature of the Tobit terms in mu: 1 for exact rows, lam*(u+lam) for censored
        # (Gauss-Newton in the parameters: the form's own curvature is left out).
        sd = self.noise_std
        weight = np.ones(len(y))
        cens = kinds != EXACT
        sign = np.where(kinds[cens] == AT_LEAST, 1.0, -1.0)
        u = sign * (mu[cens] - y[cens]) / sd
        lam = np.exp(_log_mills(u))
        weight[cens] = lam * (u + lam)
        hess = (jac * weight[:, None]).T @ jac / sd**2 + self.prior_precision
        cov = np.linalg.inv(hess)
        return 0.5 * (cov + cov.T)

    # ---- predicting ------------------------------------------------------------------
    def predict_main(self, main: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd of the expected log peak bytes (noise excluded)."""
        if self._cache is not None and self._cache[0] is main:
            return self._cache[1], self._cache[2]
        means, sds = [], []
        for lo in range(0, len(main), _CHUNK):
            chunk = main[lo:lo + _CHUNK]
            mu, jac = self._mean_and_jacobian(self.coef_mean, chunk, self._sharding_features(chunk))
            means.append(mu)
            sds.append(np.sqrt(np.maximum(((jac @ self.coef_cov) * jac).sum(axis=1), 1e-12)))
        mean = np.concatenate(means) if means else np.zeros(0)
        sd = np.concatenate(sds) if sds else np.zeros(0)
        if len(main) > 1:  # the engine asks for the whole feasible space several times per round
            self._cache = (main, mean, sd)
        return mean, sd

    def fit_probability_main(self, main: np.ndarray) -> np.ndarray:
        """P(peak < capacity) for each row; 1 where capacity is unknown."""
        if not self.capacity_bytes:
            return np.ones(main.shape[0])
        mean, sd = self.predict_main(main)
        total_sd = self.calibration * np.sqrt(sd**2 + self.noise_std**2)
        return special.ndtr((math.log(self.capacity_bytes) - mean) / total_sd)

    def _effects(self, coef: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        num = self.encoding.num_settings
        main = np.vstack([np.zeros((1, num)), np.eye(num)])
        mu, jac = self._mean_and_jacobian(coef, main, self._sharding_features(main))
        diff = jac[1:] - jac[:1]
        return mu[1:] - mu[0], np.sqrt(np.maximum(((diff @ cov) * diff).sum(axis=1), 1e-12))

    def main_effects(self) -> tuple[np.ndarray, np.ndarray]:
        """Each setting's log effect on the baseline's peak and its sd (the memory price)."""
        return self._effects(self.coef_mean, self.coef_cov)

    def prior_main_effects(self) -> tuple[np.ndarray, np.ndarray]:
        """The same under the prior (what prior revision compares the posterior with)."""
        return self._effects(self.prior_mean, self.prior_cov)

    @property
    def baseline_peak_bytes(self) -> float:
        main = np.zeros((1, self.encoding.num_settings))
        mu, _ = self._mean_and_jacobian(self.coef_mean, main, self._sharding_features(main))
        return float(math.exp(mu[0]))

    def price_bytes(self) -> np.ndarray:
        """Each setting's memory price in bytes relative to the baseline config's peak."""
        return self.baseline_peak_bytes * np.expm1(self.main_effects()[0])
