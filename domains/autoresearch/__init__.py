"""AutoResearch domain: agents write experiment code for ML tasks; a hidden-label grader scores it."""
