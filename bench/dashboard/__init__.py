"""The parts of ``scripts/dashboard_picture``, which draws the Grafana dashboard as a picture with
real data (docs/img/grafana-dashboard.png).

From the bottom up: ``machine`` (the repository's paths, the Debian tools, a port, HTTP, waiting),
``processes`` (the processes the picture starts), ``run`` (the run's pace and what the caption says
about it), ``prometheus`` (its configuration and HTTP API), ``queries`` (the panels' PromQL as
Grafana sends it), ``example`` (the example project's run, then the queries), ``layout`` (the grid,
the dark theme, text widths), ``formats`` (values as Grafana writes them), ``panels`` (a stat, a
table, a time series), ``page`` (the HTML page) and ``browser`` (its screenshot).
"""
