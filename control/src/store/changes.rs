//! `Changes`: what changed in the store since the last sync, for the table builder's partial
//! updates and the change metrics.

use std::collections::BTreeSet;
use std::time::SystemTime;

use crate::model::{service_name_of, Kind, Object, ObjectKey};

/// What changed since the last sync.
#[derive(Debug, Default)]
pub struct Changes {
    /// Services to retranslate (changed, or one of their EndpointSlices changed).
    pub services: BTreeSet<ObjectKey>,
    /// Rebuild everything (this node, ServiceCIDRs).
    pub full: bool,
    /// Recompile the NetworkPolicy tables (Pods, Namespaces, NetworkPolicies).
    pub policy: bool,
    /// The Pods changed (for the policy compiler).
    pub pods: BTreeSet<ObjectKey>,
    /// Some Namespace changed (for the policy compiler).
    pub namespaces: bool,
    /// Some NetworkPolicy changed (for the policy compiler).
    pub network_policies: bool,
    /// Some ClusterNetworkPolicy changed (for the policy compiler).
    pub cluster_network_policies: bool,
    pub service_changes: u64,
    pub endpoint_changes: u64,
    /// Change times of the objects (for network_programming_duration_seconds); bounded.
    pub triggers: Vec<SystemTime>,
}

const MAX_TRIGGERS: usize = 4096;
/// The EndpointSlice controller's annotation: when the change that caused this slice happened.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && !self.full && !self.policy
    }

    fn trigger(&mut self, t: SystemTime) {
        if self.triggers.len() < MAX_TRIGGERS {
            self.triggers.push(t);
        }
    }

    /// Records what an object (the new or the old version of a change) touches: its Service
    /// (a Service, or the Service an EndpointSlice names), the policy tables, or everything.
    pub(super) fn touch(&mut self, key: &ObjectKey, obj: &Object, node_name: &str) {
        match obj {
            Object::Service(_) => {
                self.services.insert(key.clone());
            }
            Object::EndpointSlice(s) => {
                if let Some(svc) = service_name_of(s) {
                    self.services
                        .insert(ObjectKey::new(key.namespace.clone(), svc));
                }
            }
            Object::Node(_) => self.full |= key.name == node_name,
            Object::ServiceCidr(_) => self.full = true,
            Object::Pod(_) => {
                self.policy = true;
                self.pods.insert(key.clone());
            }
            Object::Namespace(_) => {
                self.policy = true;
                self.namespaces = true;
            }
            Object::NetworkPolicy(_) => {
                self.policy = true;
                self.network_policies = true;
            }
            Object::ClusterNetworkPolicy(_) => {
                self.policy = true;
                self.cluster_network_policies = true;
            }
        }
    }

    /// Counts one change of a kind (the `*_changes` metrics), with its trigger time.
    pub(super) fn count(&mut self, kind: Kind, trigger: SystemTime) {
        match kind {
            Kind::Service => self.service_changes += 1,
            Kind::EndpointSlice => self.endpoint_changes += 1,
            _ => return,
        }
        self.trigger(trigger);
    }
}
