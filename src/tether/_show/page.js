(function(){
const T=JSON.parse(document.getElementById('timeline-data').textContent);
const $=id=>document.getElementById(id);
const ops=T.operations, ROW=28, LABEL=150, MSG=24;
function iso(ms){return ms==null?'?':new Date(ms).toISOString().slice(11,23);}
function dur(ms){return ms<1000?ms+' ms':ms<60000?(ms/1000).toFixed(1)+' s':Math.floor(ms/60000)+' min '+Math.floor(ms%60000/1000)+' s';}
const GAP_LABEL={crash:'✖ crash',queued:'⧖ queued',open:'… open'};
function esc(s){return String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'})[c]);}
// ---- header and gap list
$('meta').textContent=`${T.session.model} (${T.session.provider}) · created ${T.session.createdAt} · ${T.facts} facts · ${ops.length} operations · ${T.transcript.length} messages · usage in ${T.usage.input} out ${T.usage.output} · now ${T.current}`;
const gl=$('gaps');const crashes=T.gaps.filter(g=>g.kind!=='stop'),stops=T.gaps.filter(g=>g.kind==='stop');
let gh=`<div><b>${crashes.filter(g=>g.kind==='crash').length} crash(es)</b>, ${stops.length} idle stop(s)</div>`;
crashes.slice(0,500).forEach((g,i)=>{gh+=`<div class="gap-item ${g.kind}" id="gap-${i}" data-kind="${g.kind}"><b>${GAP_LABEL[g.kind]||g.kind}${g.certain||g.kind!=='crash'?'':' (inferred)'}</b> ${iso(g.start)} → ${g.end==null?'(log ends)':iso(g.end)+' ('+dur(g.end-g.start)+')'}, after seq ${g.afterSeq}: ${esc(g.evidence)}${g.recovery?'<br>&nbsp;&nbsp;recovery: <span class="recovery">'+esc(g.recovery)+'</span>':''}</div>`;});
gl.innerHTML=gh;
// ---- compressed time axis: idle stretches longer than CAP are drawn CAP long
const spans=[];ops.forEach(o=>spans.push([o.start,o.end==null?T.end:o.end]));
const durs=spans.map(s=>s[1]-s[0]).sort((a,b)=>a-b);const CAP=Math.max(50,durs.length?durs[durs.length>>1]:50);
const cuts=[];let cur=T.start;
spans.forEach(s=>{if(s[0]-cur>CAP)cuts.push([cur,s[0]]);cur=Math.max(cur,s[1]);});
T.gaps.forEach(g=>{if(g.kind==='crash'&&g.end!=null&&g.end-g.start>CAP)cuts.push([g.start,g.end]);});
cuts.sort((a,b)=>a[0]-b[0]);const merged=[];cuts.forEach(c=>{const l=merged[merged.length-1];if(l&&c[0]<=l[1])l[1]=Math.max(l[1],c[1]);else merged.push([c[0],c[1]]);});
const before=[];let acc=0;merged.forEach(c=>{before.push(acc);acc+=(c[1]-c[0])-CAP;});
function X(t){let lo=0,hi=merged.length-1,k=-1;while(lo<=hi){const m=(lo+hi)>>1;if(merged[m][0]<=t){k=m;lo=m+1}else hi=m-1;}
 if(k<0)return t-T.start;const c=merged[k];const saved=before[k];
 if(t>=c[1])return t-T.start-saved-((c[1]-c[0])-CAP);return c[0]-T.start-saved+(t-c[0])/(c[1]-c[0])*CAP;}
const total=Math.max(1,X(T.end))*1.02+1;
const sc=$('scroller'),rows=$('rows'),axis=$('axis');
let scale=1;function fit(){scale=Math.max(1e-6,(sc.clientWidth-LABEL-20)/total);draw();}
function px(t){return LABEL+X(t)*scale;}
// ---- boxes
function box(cls,start,end,label,info){const el=document.createElement('div');el.className='box '+cls;
 const x=px(start),w=Math.max(3,px(end==null?T.end:end)-x);el.style.left=x+'px';el.style.width=w+'px';el.textContent=label;
 el.title=label+' '+iso(start)+(end!=null?' ('+dur(end-start)+')':'');el.onclick=()=>show(info);return el;}
function lane(i){const o=ops[i];const el=document.createElement('div');el.className='lane';el.style.top=(i*ROW)+'px';el.style.width=(LABEL+total*scale+20)+'px';el.dataset.op=o.operationId;
 const lb=document.createElement('span');lb.className='lane-label';lb.textContent=`${o.kind} #${o.number} ${o.outcome}`;lb.title=(o.prompt||'')+' — click to zoom';
 lb.onclick=()=>{const a=X(o.start),b=X(o.end==null?T.end:o.end);scale=Math.max(1e-6,(sc.clientWidth-LABEL-40)/Math.max(1,b-a));draw();sc.scrollLeft=a*scale;show({operation:o});};
 el.appendChild(lb);
 o.steps.forEach(s=>{s.attempts.forEach(a=>el.appendChild(box('attempt '+a.outcome,a.start,a.end,`model ${s.number}.${a.attempt} ${a.outcome}`,{step:s.number,attempt:a})));
  s.toolCalls.forEach(c=>{const st=c.start==null?(c.end==null?o.start:c.end):c.start;const b=box('call '+c.outcome+(c.recovered?' recovered':''),st,c.end,`${c.name} ${c.outcome}${c.recovered?' (recovered)':''}`,{call:c});
   b.dataset.call=c.callId;if(c.recoveredFromLedger)b.dataset.ledger='recovered';el.appendChild(b);});});
 T.gaps.forEach((g,k)=>{if(g.operationId!==o.operationId)return;const m=document.createElement('div');m.className='marker '+g.kind;m.dataset.kind=g.kind;
  const x=px(g.start),w=Math.max(4,px(g.end==null?T.end:g.end)-x);m.style.left=x+'px';m.style.width=w+'px';m.textContent=GAP_LABEL[g.kind]||g.kind;m.title=g.evidence;m.onclick=()=>show({gap:g});el.appendChild(m);});
 return el;}
let drawn={};
function draw(){rows.style.height=(ops.length*ROW)+'px';rows.style.width=(LABEL+total*scale+20)+'px';rows.innerHTML='';drawn={};paint();ticks();}
function paint(){const first=Math.max(0,Math.floor(sc.scrollTop/ROW)-5),last=Math.min(ops.length,Math.ceil((sc.scrollTop+sc.clientHeight)/ROW)+5);
 for(const k in drawn){if(k<first||k>=last){drawn[k].remove();delete drawn[k];}}
 for(let i=first;i<last;i++){if(!drawn[i]){drawn[i]=lane(i);rows.appendChild(drawn[i]);}}
 ticks();} // the axis follows the horizontal scroll
function ticks(){axis.innerHTML='';const w=sc.clientWidth-LABEL;const left=sc.scrollLeft;
 for(let p=0;p<w;p+=120){const d=(left+p)/scale;const el=document.createElement('div');el.className='tick';el.style.left=p+'px';el.textContent=iso(inv(d));axis.appendChild(el);}
 T.gaps.forEach(g=>{if(g.kind!=='stop')return;const x=px(g.start)-LABEL-left;if(x<0||x>w)return;const m=document.createElement('div');m.className='marker stop';m.dataset.kind='stop';m.style.left=x+'px';m.style.width='14px';m.style.height='22px';m.textContent='■';m.title=g.evidence;axis.appendChild(m);});}
function inv(d){let lo=T.start,hi=T.end+CAP;for(let n=0;n<40;n++){const m=(lo+hi)/2;if(X(m)<d)lo=m;else hi=m;}return Math.round(lo);}
sc.addEventListener('scroll',()=>{axis.scrollLeft=0;paint();});
$('fit').onclick=fit;$('zin').onclick=()=>{scale*=2;draw();};$('zout').onclick=()=>{scale/=2;draw();};
// ---- details
function show(info){const d=$('details');const c=info.call;let text='';
 if(c){text+=`tool call ${c.name} [${c.callId}] #${c.index}\narguments: ${c.arguments}\noutcome: ${c.outcome}${c.recovered?' (recorded by recovery after a crash)':''}\n`;
  if(c.started)text+=`started: seq ${c.startSeq} at ${iso(c.start)}, replay ${c.replay} (${c.replayKey})\n`;else text+='never started (pre-execution result)\n';
  if(c.resultSeq!=null)text+=`result: seq ${c.resultSeq} at ${iso(c.end)}: ${c.result}\n`;
  if(c.sandbox)text+=`sandboxed: ${c.sandbox}\n`;
  if(c.authorization)text+=`authorization: ${c.authorization.decision} by ${c.authorization.who} (${c.authorization.rule})\n`;
  if(c.journal)text+=`journal: ${c.journal.status} ${c.journal.path}\n  before ${c.journal.beforeHash}\n  after  ${c.journal.afterHash}\n`;
  c.reconciliations.forEach(r=>{const lk=(r.evidence||{}).lookup;text+=`reconciled: verdict ${r.verdict}, action ${r.action}${lk?', ledger lookup: '+lk.status:''}\n`;});
  if(c.recoveredFromLedger)text+='recovered_from_ledger=true: the ledger had the effect; the result was backfilled, nothing ran again\n';
  if(c.verification){const v=c.verification;text+=`verification: ${v.status} ${v.command} on version ${v.versionEnd} (${v.current?'current':'stale: the files changed since'})\n`;}
  c.reviews.forEach(r=>{text+=`review item ${r.id}: ${r.status} ${r.reason}${r.decision?' → '+r.decision:''}\n`;});
  text+=`usage: in ${c.usage.input} out ${c.usage.output}\n\n`;}
 text+=JSON.stringify(info,null,1);d.textContent=text;
}
window.tetherShow=show;
// ---- transcript (virtualised)
const tr=$('transcript'),inner=$('tinner');inner.style.height=(T.transcript.length*MSG)+'px';let tdrawn={};
function tpaint(){const first=Math.max(0,Math.floor(tr.scrollTop/MSG)-5),last=Math.min(T.transcript.length,Math.ceil((tr.scrollTop+tr.clientHeight)/MSG)+5);
 for(const k in tdrawn){if(k<first||k>=last){tdrawn[k].remove();delete tdrawn[k];}}
 for(let i=first;i<last;i++){if(tdrawn[i])continue;const m=T.transcript[i];const el=document.createElement('div');el.className='msg '+m.role;el.style.top=(i*MSG)+'px';
  el.innerHTML=`<span class="role">${esc(m.role)}</span>${esc(m.text)}`;el.title=`#${m.number} seq ${m.seq} ${iso(m.at)}\n${m.text}`;el.onclick=()=>show({message:m});tdrawn[i]=el;inner.appendChild(el);}}
tr.addEventListener('scroll',tpaint);
fit();tpaint();show({session:T.session,usage:T.usage,evidenceNote:T.evidenceNote});
window.__tetherReady=true;document.body.dataset.ready='1';
})();
