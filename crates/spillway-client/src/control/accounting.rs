//! The `accounting` request: dw_get_accounting_data_json's document (spec §4), built
//! from every server's `FragmentStatsReq` and the stripe geometry of the file the
//! ioctl was made on. It needs no manager (docs/libdatawarp.md, "Accounting").

use super::codec::Answer;
use super::Control;
use serde_json::{json, Value};
use spillway_types::{Errno, InodeNo};
use spillway_wire::messages::FragmentStatsReply;

impl Control {
    pub(super) fn accounting(&self, ino: InodeNo) -> Answer {
        match self.accounting_json(ino) {
            Ok(j) => Answer::ok(vec![j.into_bytes()]),
            Err(e) => Answer::err(e, format!("accounting: {e}")),
        }
    }

    /// The document: measured counters from every server's FragmentStatsReq; what
    /// Spillway does not track is 0 (docs/libdatawarp.md).
    fn accounting_json(&self, ino: InodeNo) -> Result<String, Errno> {
        let attr = self.inst.getattr(ino)?;
        let layout = self.inst.layout(&attr);
        let stats = self.inst.fragment_stats()?;
        let fragments: Vec<Value> = stats
            .iter()
            .zip(&self.inst.desc.servers)
            .map(|(s, name)| {
                json!({
                    "server name": name,
                    "bytes written": s.bytes_written,
                    "bytes read": s.bytes_read,
                    "write limit": 0,
                    "max window write": 0,
                    "cur capacity used": s.used,
                    "max capacity used": s.max_used,
                    "lower filesystem capacity": s.capacity,
                    "num files created": s.files_created,
                    "write highwater": 0,
                    "moving avg writes": 0,
                })
            })
            .collect();
        let sum = |f: fn(&FragmentStatsReply) -> u64| -> u64 {
            stats.iter().map(f).fold(0u64, u64::saturating_add)
        };
        let doc = json!({
            "realm": {
                "realm id": self.instance,
                "server count": stats.len(),
                "namespace count": 1,
                "fragments": fragments,
                "namespaces": [{
                    "namespace id": self.instance,
                    "stripe width": layout.width,
                    "stripe size": layout.stripe_size,
                    "substripe width": 1,
                    "substripe size": layout.stripe_size,
                    "fs bytes read": sum(|s| s.bytes_read),
                    "fs bytes written": sum(|s| s.bytes_written),
                    "stage bytes read": sum(|s| s.stage_bytes_read),
                    "stage bytes written": sum(|s| s.stage_bytes_written),
                    "max offset read": 0,
                    "max offset written": 0,
                    "file size limit": 0,
                    "num files created": sum(|s| s.files_created),
                    "num files create threshold": 0,
                }],
            }
        });
        Ok(doc.to_string())
    }
}
