"""The InfraRSI search engine: global time, memory and crash models, and selection.

``infrarsi.proposers.engine_proposer.InfraRSIProposer`` wires these together behind the proposer
interface; the modules here are plain numpy/scipy and know nothing of trials' launch.
"""
