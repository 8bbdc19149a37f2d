//! Carrying a plan out: the executor asks for the next step, performs it, and records how it
//! went. Like the kubelet, a failed step does not stop the rest; unlike a blind loop, an image
//! whose container could not be removed is skipped rather than tried (it is still in use).

use serde::Serialize;

use super::{ContainerRemoval, ImageRemoval, ReclaimPlan};

/// One step for the executor: the runtime call to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'p> {
    /// `RemoveContainer` with this container's ID.
    RemoveContainer(&'p ContainerRemoval),
    /// `RemoveImage` with this image's ID.
    RemoveImage(&'p ImageRemoval),
}

impl Step<'_> {
    pub fn target(&self) -> Target {
        match self {
            Step::RemoveContainer(c) => Target::Container {
                id: c.id.clone(),
                pod: c.pod.clone(),
                name: c.name.clone(),
            },
            Step::RemoveImage(i) => Target::Image {
                id: i.id.clone(),
                repo_tags: i.repo_tags.clone(),
            },
        }
    }

    pub fn expected_bytes(&self) -> Option<u64> {
        match self {
            Step::RemoveContainer(c) => c.expected_bytes,
            Step::RemoveImage(i) => Some(i.size_bytes),
        }
    }
}

/// What a step acted on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Target {
    Container {
        id: String,
        pod: crate::model::PodRef,
        name: String,
    },
    Image {
        id: String,
        repo_tags: Vec<String>,
    },
}

/// How a step went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum StepResult {
    Removed,
    Failed {
        error: String,
    },
    /// Not tried: the containers using the image could not be removed.
    Skipped {
        blocked_by: Vec<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub target: Target,
    #[serde(flatten)]
    pub result: StepResult,
    pub expected_bytes: Option<u64>,
}

/// A plan being carried out. Drive it with [`ReclaimRun::next_step`] and
/// [`ReclaimRun::record`], then [`ReclaimRun::finish`].
#[derive(Debug)]
pub struct ReclaimRun<'p> {
    plan: &'p ReclaimPlan,
    /// Index into containers, then images.
    next: usize,
    /// The step handed out and not yet recorded.
    pending: Option<Step<'p>>,
    outcomes: Vec<Outcome>,
}

impl<'p> ReclaimRun<'p> {
    pub(super) fn new(plan: &'p ReclaimPlan) -> Self {
        Self {
            plan,
            next: 0,
            pending: None,
            outcomes: Vec::new(),
        }
    }

    /// The next runtime call to make, or `None` when the plan is done. Steps that cannot help
    /// any more are recorded as skipped and not handed out. A step handed out and not recorded
    /// is recorded as failed ("not reported") when the next one is asked for.
    pub fn next_step(&mut self) -> Option<Step<'p>> {
        if self.pending.is_some() {
            self.record(Err("the executor did not report this step".to_string()));
        }
        loop {
            let n_containers = self.plan.containers.len();
            let step = if self.next < n_containers {
                Step::RemoveContainer(&self.plan.containers[self.next])
            } else {
                Step::RemoveImage(self.plan.images.get(self.next - n_containers)?)
            };
            self.next += 1;
            if let Step::RemoveImage(image) = step {
                let blocked_by = self.failed_among(&image.after_containers);
                if !blocked_by.is_empty() {
                    self.outcomes.push(Outcome {
                        target: step.target(),
                        result: StepResult::Skipped { blocked_by },
                        expected_bytes: step.expected_bytes(),
                    });
                    continue;
                }
            }
            self.pending = Some(step);
            return Some(step);
        }
    }

    /// How the step last handed out went. Ignored when no step is pending.
    pub fn record<E: std::fmt::Display>(&mut self, result: Result<(), E>) {
        let Some(step) = self.pending.take() else {
            return;
        };
        self.outcomes.push(Outcome {
            target: step.target(),
            result: match result {
                Ok(()) => StepResult::Removed,
                Err(e) => StepResult::Failed {
                    error: e.to_string(),
                },
            },
            expected_bytes: step.expected_bytes(),
        });
    }

    /// The outcomes so far; steps never handed out are not in it.
    pub fn finish(mut self) -> ReclaimReport {
        if self.pending.is_some() {
            self.record(Err("the executor did not report this step".to_string()));
        }
        ReclaimReport {
            outcomes: self.outcomes,
        }
    }

    fn failed_among(&self, ids: &[String]) -> Vec<String> {
        ids.iter()
            .filter(|id| {
                self.outcomes.iter().any(|o| {
                    matches!(&o.target, Target::Container { id: done, .. } if done == *id)
                        && !matches!(o.result, StepResult::Removed)
                })
            })
            .cloned()
            .collect()
    }
}

/// What a carried-out plan did, step by step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReclaimReport {
    pub outcomes: Vec<Outcome>,
}

impl ReclaimReport {
    pub fn removed(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes
            .iter()
            .filter(|o| o.result == StepResult::Removed)
    }

    pub fn failed(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes
            .iter()
            .filter(|o| matches!(o.result, StepResult::Failed { .. }))
    }

    /// What the removed objects were expected to free (the runtime's sizes); the freed bytes
    /// themselves are what the next observation of the filesystem shows.
    pub fn expected_bytes_removed(&self) -> u64 {
        self.removed().filter_map(|o| o.expected_bytes).sum()
    }
}
