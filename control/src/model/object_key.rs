//! The key of every object kxdp reads: `namespace/name`, in a module of its own so that the
//! records (`pod.rs`) and the cluster state (`model.rs`) both use it without importing each other.

use std::fmt;

/// `namespace/name`; cluster-scoped objects have an empty namespace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn cluster(name: impl Into<String>) -> Self {
        ObjectKey {
            namespace: String::new(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            f.write_str(&self.name)
        } else {
            write!(f, "{}/{}", self.namespace, self.name)
        }
    }
}
