"""What a run found: the findings of the groups, the summary, the checks, verification and the HTML report."""
