"""Planning: from a StepProfile to the plan with the least recomputation that fits a budget."""

from remat.planner.api import baseline_plans, frontier, plan
from remat.planner.plan import Plan, load_plan

__all__ = ["Plan", "baseline_plans", "frontier", "load_plan", "plan"]
