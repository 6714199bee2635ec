"""Ray's ``ray.job_submission``: run a shell command (a driver script) on the cluster,
follow what it prints, and stop it; served by the head over rtml's authenticated
protocol (``rtml job submit`` is its command line).

    JobSubmissionClient   rtml.job_submission.client   submit_job, stop_job, get_job_status,
                                                       get_job_info, list_jobs, get_job_logs,
                                                       tail_job_logs (async), delete_job
    JobStatus             rtml.job_submission.spec     PENDING RUNNING STOPPED SUCCEEDED FAILED
    JobDetails            a job's fields, as Ray's
    spec, working_dir     what the client and the head share: ids, runtime_env, the upload
"""

from __future__ import annotations

from rtml.job_submission import spec, working_dir
from rtml.job_submission.client import JobDetails, JobSubmissionClient
from rtml.job_submission.spec import JobStatus

JobInfo = JobDetails
"""Ray's older name for a job's details."""

__all__ = ["JobDetails", "JobInfo", "JobStatus", "JobSubmissionClient", "spec", "working_dir"]
