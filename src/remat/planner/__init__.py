"""Planning: from a StepProfile to the plan with the least recomputation that fits a budget."""

from remat.planner.api import frontier, make_plan, plan
from remat.planner.problem import Problem
from remat.planner.recipes import baseline_plans

__all__ = ["Problem", "baseline_plans", "frontier", "make_plan", "plan"]
