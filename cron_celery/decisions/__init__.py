"""What the database decides, each module named for its decision: the claim, the final write, a slot's
dispatch, waiting runs, concurrency groups, dependencies, one-off runs, repairs, timing marks, removed
jobs, the job rows and the audit log's author. Each locks the job's row first; the SQL is here and
nowhere else. Imports only declaring and the top."""
