//! The eviction message, worded exactly as the kubelet's `evictionMessage`.

use crate::pod::PodInfo;
use crate::quantity::{Format, Quantity};
use crate::signal::Resource;

/// A container named in the eviction message: it used more of the starved resource than it
/// requests. The kubelet lists these in the event's `offending_containers` and
/// `offending_containers_usage` annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct OffendingContainer {
    pub name: String,
    pub usage: Quantity,
}

/// `nodeLowMessageFmt`, `thresholdMetMessageFmt` and one `containerMessageFmt` per container
/// using more than it requests (memory and ephemeral-storage only), each ending in a space;
/// and those containers, for the annotations.
pub fn eviction_message(
    resource: Resource,
    pod: &PodInfo,
    threshold: Option<(Quantity, Quantity)>,
) -> (String, Vec<OffendingContainer>) {
    let mut message = format!("The node was low on resource: {resource}. ");
    let mut offending = Vec::new();
    if let Some((quantity, available)) = threshold {
        message += &format!("Threshold quantity: {quantity}, available: {available}. ");
    }
    if pod.usage.is_none() {
        return (message, offending);
    }
    for container in &pod.containers {
        let Some(usage) = &container.usage else {
            continue;
        };
        let (used, request) = match resource {
            Resource::Memory => (usage.memory_working_set_bytes, container.requests.memory),
            Resource::EphemeralStorage => (
                usage.ephemeral_storage_bytes(),
                container.requests.ephemeral_storage,
            ),
            Resource::Inodes | Resource::Pids => (None, None),
        };
        let Some(used) = used else {
            continue;
        };
        let used = Quantity::from_int(i64::try_from(used).unwrap_or(i64::MAX), Format::BinarySi);
        let request = request.unwrap_or(Quantity::from_int(0, Format::DecimalSi));
        if used.cmp_value(&request).is_gt() {
            message += &format!(
                "Container {} was using {used}, request is {request}, has larger consumption of {resource}. ",
                container.name
            );
            offending.push(OffendingContainer {
                name: container.name.clone(),
                usage: used,
            });
        }
    }
    (message, offending)
}
