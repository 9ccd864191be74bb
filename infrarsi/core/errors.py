"""One exception hierarchy. Every message says what was wrong and what to do next."""


class InfrarsiError(Exception):
    """Root of every error infrarsi raises on purpose."""


class SpecError(InfrarsiError):
    """The campaign spec is malformed or inconsistent; fix the spec file."""


class ContractError(InfrarsiError):
    """The locked contract cannot be established or was broken outside a trial."""


class PatchError(InfrarsiError):
    """A code patch does not apply or escapes its editable scope."""


class TrialInfrastructureError(InfrarsiError):
    """The trial could not be run for reasons outside the config (a fault, not data)."""


class ResumeError(InfrarsiError):
    """A campaign directory cannot be resumed."""


class UnreachableError(InfrarsiError):
    """An outside system (Ray cluster, MLflow server, experience bank) did not answer at
    the address given; the message names the address and the option that changes it."""


class BankUnavailableError(UnreachableError):
    """The experience bank could not be opened, read or written."""
