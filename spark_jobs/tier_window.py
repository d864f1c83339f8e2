"""Apply one tier window (redelivery.jobs.tier_window: the engine hook submits the same job), with
the redelivery package installed where the driver runs:

    spark-submit spark_jobs/tier_window.py --request '{"tier": "seconds",
        "window_end": "2026-01-01T00:00:10+00:00", "run_key": "manual-1"}' [--spark-threshold N]
"""

from redelivery.jobs.tier_window import main

if __name__ == "__main__":
    main()
