"""``meshctl bug-report``: one redacted archive of what a maintainer needs, with a summary first."""
