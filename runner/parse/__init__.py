"""Pure, versioned parsers of judge answers and automatic metrics of answers."""
