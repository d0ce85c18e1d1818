"""Rule-based scorers (gsm8k, MATH) and the data_source router."""
