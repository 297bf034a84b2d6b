#!/usr/bin/env python3
"""Functions of 150 lines or more under the given folders, longest first
(issue 33: none over ~200 lines without a reason in its comment).

    scripts/long-functions.py lib tools examples runtime

A brace-matching heuristic, not a parser: comments and string literals are
blanked, then a '{' that follows ')' (and not if/for/while/switch/catch) at
the outermost function level opens a function. Prints LINES FILE LINE NAME;
NAME is a guess from the text before the brace.
"""
import os
import re
import sys
def strip(src):
    out=[];i=0;n=len(src)
    while i<n:
        c=src[i]
        if src.startswith('//',i):
            j=src.find('\n',i); j=n if j<0 else j; out.append(' '*(j-i)); i=j
        elif src.startswith('/*',i):
            j=src.find('*/',i+2); j=n if j<0 else j+2; out.append(re.sub(r'[^\n]',' ',src[i:j])); i=j
        elif c=='"' or c=="'":
            if c=='"' and i>0 and src[i-1]=='R':
                m=re.match(r'R"([^(]*)\(',src[i-1:]); d=m.group(1); end=src.find(')'+d+'"',i); j=end+len(d)+2
            else:
                j=i+1
                while j<n and src[j]!=c:
                    j+= 2 if src[j]=='\\' else 1
                j+=1
            out.append(c+re.sub(r'[^\n]',' ',src[i+1:j-1])+c); i=j
        else: out.append(c); i+=1
    return ''.join(out)
res=[]
for root in sys.argv[1:]:
  for dp,dn,fn in os.walk(root):
    for f in fn:
      if not f.endswith(('.cpp','.h','.cu')): continue
      p=os.path.join(dp,f); s=strip(open(p,errors='replace').read())
      stack=[]
      for m in re.finditer(r'[{}]',s):
        if m.group()=='{':
          pre=s[max(0,m.start()-300):m.start()].rstrip()
          isfn=bool(re.search(r'\)\s*(const|override|noexcept|final|mutable|\s|->\s*[\w:<>,\s\*&]+)*$',pre)) and not re.search(r'\b(if|for|while|switch|catch)\s*\([^;{}]*\)\s*$',pre)
          stack.append((m.start(),isfn))
        else:
          if not stack: continue
          st,isfn=stack.pop()
          if isfn and not any(x[1] for x in stack):
            a=s.count('\n',0,st)+1; b=s.count('\n',0,m.start())+1
            if b-a>=150:
              line=s[:st].rsplit('\n',3)[-3:]
              name=re.findall(r'([\w:~]+)\s*\(',''.join(s[max(0,st-400):st].split('\n')[-6:]))
              res.append((b-a,p,a,name[0] if name else '?'))
for r in sorted(res,reverse=True): print(*r)
