"""Per-task metrics, expert utilisation and reports."""
