"""See what training does: a read-only web dashboard and terminal views of a store.

``lightning-rl dashboard --store runs/demo/store.sqlite`` serves the page; ``lightning-rl inspect``
shows the same views in a terminal. Both read through the store's public API and replay the
trainer's own adapter and credit assignment, so a rollout's transitions, AIR rewards and advantages
are the ones training used. The web server needs the ``dashboard`` extra (FastAPI, uvicorn, rich); it is
imported only by ``lightning_rl.dashboard.app`` / ``.serve``, so importing this package stays light.
"""

from __future__ import annotations

from lightning_rl.dashboard._settings import CreditSettings, find_run_dir, load_credit_settings
from lightning_rl.dashboard.index import RolloutFilter, RolloutIndex, RolloutPage, RolloutSummary
from lightning_rl.dashboard.views import credit_view, rollout_detail, span_tree

__all__ = [
    # settings of the run being shown
    "CreditSettings",
    "load_credit_settings",
    "find_run_dir",
    # the rollouts list
    "RolloutIndex",
    "RolloutFilter",
    "RolloutPage",
    "RolloutSummary",
    # one rollout
    "rollout_detail",
    "credit_view",
    "span_tree",
]
