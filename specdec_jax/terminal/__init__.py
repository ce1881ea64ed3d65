"""What the commands print (`console`)."""
