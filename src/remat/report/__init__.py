"""Reports: pure functions from remat's data to text and pictures.

Importing this package registers the text report of each data type, so that
`str(profile)`, `str(plan)`, `str(report)` and `str(explanation)` print them
(`remat.types._text`).
"""

from remat.report.explain_text import render_explanation
from remat.report.plan_text import render_plan, render_verify
from remat.report.text import render_profile
from remat.types import Explanation, Plan, StepProfile, VerifyReport
from remat.types._text import render

render.register(StepProfile, render_profile)
render.register(Plan, render_plan)
render.register(VerifyReport, render_verify)
render.register(Explanation, render_explanation)

__all__ = ["render_explanation", "render_plan", "render_profile", "render_verify"]
