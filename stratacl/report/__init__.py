"""What a run reports: the text report, the verdict, result tables and timelines."""
