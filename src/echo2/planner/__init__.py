"""Capacity model, provisioning rule and cost-aware activation: pure functions, no torch.

The coordinator's online controller (activation + hysteresis every control period), the
simulator (capacity formulas, dissemination models, activation rule) and `echo2 plan` all
import from here; nothing in this package performs I/O or keeps state.
"""

from echo2.planner.activation import activate, activate_exact
from echo2.planner.capacity import (
    base_throughput_rps,
    effective_throughput_rps,
    learner_utilization,
    masked_token_share,
    min_staleness,
    overlap_holds,
    required_throughput_rps,
    rollouts_generated_per_step,
    step_wall_s,
    swap_ahead_steps,
    swapped_lateness_s,
)
from echo2.planner.cost import centralized_step_s, cost_per_rollout, cost_per_step, saving_fraction
from echo2.planner.covering import Activation, Offer, covers
from echo2.planner.dissemination import (
    TOPOLOGIES,
    chain_s,
    dissemination_s,
    ideal_s,
    leaf_slots,
    one_to_many_s,
    tree_levels,
    tree_s,
)
from echo2.planner.greedy import activate_greedy
from echo2.planner.hysteresis import Decision, fleet_totals, keep_or_switch
from echo2.planner.plan import Plan, make_plan

__all__ = [
    "TOPOLOGIES",
    "Activation",
    "Decision",
    "Offer",
    "Plan",
    "activate",
    "activate_exact",
    "activate_greedy",
    "base_throughput_rps",
    "centralized_step_s",
    "chain_s",
    "cost_per_rollout",
    "cost_per_step",
    "covers",
    "dissemination_s",
    "effective_throughput_rps",
    "fleet_totals",
    "ideal_s",
    "keep_or_switch",
    "leaf_slots",
    "learner_utilization",
    "make_plan",
    "masked_token_share",
    "min_staleness",
    "one_to_many_s",
    "overlap_holds",
    "required_throughput_rps",
    "rollouts_generated_per_step",
    "saving_fraction",
    "step_wall_s",
    "swap_ahead_steps",
    "swapped_lateness_s",
    "tree_levels",
    "tree_s",
]
