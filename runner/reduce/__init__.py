"""The reduce stage: judgments from cached answers, correlations, battles."""
