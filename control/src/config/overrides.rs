//! `nodeOverrides`: the entries matching this node's labels, applied in order.

use std::collections::BTreeMap;

use super::schema::{DataplaneConfiguration, NodeOverride};

impl DataplaneConfiguration {
    /// Applies one override's fields.
    pub(super) fn apply(&mut self, o: &NodeOverride) {
        if let Some(i) = &o.interfaces {
            self.interfaces = i.clone();
        }
        if let Some(m) = o.xdp_mode {
            self.xdp_mode = m;
        }
        if let Some(w) = &o.workers {
            if let Some(c) = w.count {
                self.workers.count = c;
            }
            if let Some(c) = &w.cpus {
                self.workers.cpus = c.clone();
            }
            if let Some(i) = &w.idle {
                self.workers.idle = i.clone();
            }
        }
        if let Some(x) = &o.afxdp {
            self.afxdp = x.clone();
        }
    }

    /// This node's configuration: the top-level fields, then every `nodeOverrides` entry whose
    /// selector matches `labels`, in file order (a later match wins for the fields it sets).
    /// Returns the configuration and the indexes of the overrides applied.
    pub fn for_node(&self, labels: &BTreeMap<String, String>) -> (Self, Vec<usize>) {
        let mut out = self.clone();
        let mut applied = Vec::new();
        for (i, o) in self.node_overrides.iter().enumerate() {
            if o.node_selector.matches(labels) {
                out.apply(o);
                applied.push(i);
            }
        }
        (out, applied)
    }
}
