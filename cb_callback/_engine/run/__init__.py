"""The run itself: the entry points, the options, the plugin contracts, and one component's lifecycle.

Takes a model (or a capture) and a ``BenchmarkConfig``; gives a ``Report``. The phases
in order (``profile.py``), the preparation shared by every entry point
(``preparation.py``), what every phase of one run reads (``context.py``), its first
phase (the in-situ pass, the census and the triage's plan: ``triage_phase.py``), the
schedule (``schedule.py``), one component (``component.py``), the plugin contracts
(``plugins.py``), the extensions the upper layers install (``extensions.py``), the run's
metadata and its progress count (``schedule_count.py``).
"""
