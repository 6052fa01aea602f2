"""The launch spec: parsing, editing and rendering a server's command line losslessly."""
