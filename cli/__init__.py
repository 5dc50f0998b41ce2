"""The trainscout command line."""
