//! The job a piece of work runs for: set around a job's attempt, so what
//! happens deep inside it (a plugin's request reading a referenced secret)
//! can name the job in the audit log without every layer passing it on.

use std::future::Future;

tokio::task_local! {
    static JOB_ID: String;
}

/// Runs `work` as part of job `job_id`.
pub(crate) async fn within<F: Future>(job_id: String, work: F) -> F::Output {
    JOB_ID.scope(job_id, work).await
}

/// The job the current task runs for, if any.
pub(crate) fn current() -> Option<String> {
    JOB_ID.try_with(Clone::clone).ok()
}

/// `work` carrying the current task's job (if any) onto the task it is
/// spawned on.
pub(crate) fn carried<F: Future>(work: F) -> impl Future<Output = F::Output> {
    let job = current();
    async move {
        match job {
            Some(job) => JOB_ID.scope(job, work).await,
            None => work.await,
        }
    }
}
