"""Reports made from result files alone: rows in, Markdown tables and PNG plots out."""
