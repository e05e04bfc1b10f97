"""Pure capacity-planning maths: memory fit, KV capacity, roofline step times, load operating
points, replicas per role under an SLO, cost, and the calibration behind them."""
